"""Compare runs in one figure: ``python compare.py <run or sweep folders...> [--metric M] [--out FILE]``.

Each varied hyperparameter against the runs' optimized metric, and their validation curves overlaid
(src/mnistlab/sweeps/comparison.py); a sweep draws the same at its end, as comparison.png beside its
summary.csv. The folders are data (docs/reliability.md, Trust): read as plain files, nothing in them runs.
"""

import argparse
from pathlib import Path

from mnistlab.runtime.run.reported import reported


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("folders", nargs="+", type=Path, help="run folders, sweep folders, or both")
    parser.add_argument("--metric", help="what to compare; default: the runs' optimized_metric (conf/train.yaml)")
    parser.add_argument("--curve", help="the curve to overlay; default: the metric without _best (val/acc)")
    parser.add_argument("--out", type=Path, help="the PNG; default: comparison.png in the one folder given, else here")
    args = parser.parse_args()
    with reported():
        from mnistlab.sweeps import comparison  # matplotlib, once the arguments are known to be right

        print(f"Compared the runs in {comparison.compare(args.folders, args.metric, args.curve, args.out)}")


if __name__ == "__main__":
    main()
