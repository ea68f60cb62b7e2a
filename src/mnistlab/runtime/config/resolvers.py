"""Every ``${name:...}`` resolver that conf/ uses, registered in one place (imported with this subpackage,
so before any config of the project is composed): the run folder's names and claim, and torchrun's counts.
"""

from mnistlab.runtime.config import hydra_versions
from mnistlab.runtime.run import launch, run_folder

# Cached, as Hydra's ${now:}: a run resolves its folder's name once, and a sweep's jobs share the cache.
hydra_versions.register_resolver("claim_folder", run_folder.claim, use_cache=True)
hydra_versions.register_resolver("saved_once", run_folder.saved_once)  # not cached: each job asks of its own
hydra_versions.register_resolver("run_folder", run_folder.name)  # ${run_folder:checkpoints}
hydra_versions.register_resolver("torchrun", launch.started_by_torchrun)  # ${torchrun:devices,1}
