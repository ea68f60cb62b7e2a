"""An S3 server (moto's, on this machine, on loopback) that checks credentials as a real one does: the
bucket of the tests that stream (tests/test_streaming.py) and of the walk-through that streams its data
(tests/test_generator.py). Pure Python from PyPI (``moto[server]``, in ``dev``): docs/streaming.md says why."""

import json
from pathlib import Path

import processes
from running import free_port


def start(log: Path, bucket: str) -> dict[str, str]:
    """Start the server with ``bucket`` in it; the environment a user's shell gives: endpoint and keys (an
    IAM user's, allowed everything). The server ends with the test (processes.start)."""
    port = free_port()
    # The first 3 requests (the user, its key, its policy) need none; every request after them is signed.
    server = processes.start(
        ["env", "INITIAL_NO_AUTH_ACTION_COUNT=3", "moto_server", "-H", "127.0.0.1", "-p", port], output=log.open("w")
    )
    import boto3

    endpoint = {"endpoint_url": f"http://127.0.0.1:{port}", "region_name": "us-east-1"}
    unsigned = {"aws_access_key_id": "setup", "aws_secret_access_key": "setup"}

    def user() -> dict[str, str] | None:
        try:
            iam = boto3.client("iam", **endpoint, **unsigned)
            iam.create_user(UserName="trainer")
        except Exception:  # noqa: BLE001 (not listening yet)
            assert server.poll() is None, log.read_text()[-2000:]
            return None
        key = iam.create_access_key(UserName="trainer")["AccessKey"]
        allow = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}
        iam.put_user_policy(UserName="trainer", PolicyName="all", PolicyDocument=json.dumps(allow))
        return {"AWS_ACCESS_KEY_ID": key["AccessKeyId"], "AWS_SECRET_ACCESS_KEY": key["SecretAccessKey"]}

    keys = processes.until(user, 60, lambda: log.read_text()[-2000:], every=0.3)
    signed = {"aws_access_key_id": keys["AWS_ACCESS_KEY_ID"], "aws_secret_access_key": keys["AWS_SECRET_ACCESS_KEY"]}
    boto3.client("s3", **endpoint, **signed).create_bucket(Bucket=bucket)
    return {"AWS_ENDPOINT_URL": endpoint["endpoint_url"], "AWS_DEFAULT_REGION": "us-east-1", **keys}
