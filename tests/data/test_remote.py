"""Remote shards that cannot be read say why (asr.data.remote), naming the address: against moto's S3 server and an
https server on localhost, as tests/data/test_shards.py reads good ones."""

from __future__ import annotations

import os
from unittest import mock

import pytest

from asr.data import remote
from asr.data.shards import ShardIndex, ShardsError
from asr.tools.sharding import shard
from tests.data.test_shards import mini
from tests.servers import S3_ENV, environment, free_port, s3_server, web_server


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """4 bundled utterances in 2 shards."""
    tmp = tmp_path_factory.mktemp("remote")
    shard(tmp / "train", [str(mini(tmp, 4))], shard_size=2, tokenizer_type="char")
    return tmp / "train"


def refusal(root: str) -> str:
    with pytest.raises(ShardsError) as refused:
        ShardIndex.read(root, "data.train_shards")
    return str(refused.value)


def test_s3_faults_say_what_is_wrong_and_where(shards, monkeypatch):
    with s3_server(shards) as (address, _):
        bucket = address.split("/")[2]
        assert refusal(f"s3://no-{bucket}/train").startswith(
            f"data.train_shards: cannot read s3://no-{bucket}/train/index.json: no such bucket (NoSuchBucket")
        assert refusal(f"{address}-typo").startswith(
            f"data.train_shards: cannot read {address}-typo/index.json: no such file (NoSuchKey")
        import moto.settings
        with mock.patch.object(moto.settings, "INITIAL_NO_AUTH_ACTION_COUNT", 0):  # moto checks keys from now on
            assert refusal(address).startswith(f"data.train_shards: cannot read {address}/index.json: access denied: "
                                               "check the credentials")
        with mock.patch.dict(os.environ):
            del os.environ["AWS_ACCESS_KEY_ID"], os.environ["AWS_SECRET_ACCESS_KEY"]
            monkeypatch.setattr(remote, "_SET_UP", {})  # a client made now, without them
            assert refusal(address) == (f"data.train_shards: cannot read {address}/index.json: no S3 credentials: set "
                                        "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE")
        assert "pip install smart_open" not in refusal(f"s3://no-{bucket}/train")
    nowhere = f"http://127.0.0.1:{free_port()}"
    with environment({**S3_ENV, "AWS_ENDPOINT_URL": nowhere}):
        monkeypatch.setattr(remote, "_SET_UP", {})
        assert refusal(address).startswith(f"data.train_shards: cannot read {address}/index.json: cannot reach the S3 "
                                           f"endpoint {nowhere} (EndpointConnectionError")


def test_https_faults_say_what_is_wrong_and_where(shards):
    with web_server(shards.parent) as (address, _):
        assert refusal(f"{address}/nothing").startswith(
            f"data.train_shards: cannot read {address}/nothing/index.json: no such file (HTTPError: 404")
    assert refusal(f"{address}/{shards.name}").startswith(  # the server is gone
        f"data.train_shards: cannot read {address}/{shards.name}/index.json: cannot reach the server (ConnectionError")


def test_a_read_without_an_answer_is_said_as_such():
    class ReadTimeout(OSError):
        pass

    try:
        try:
            raise ReadTimeout("HTTPSConnectionPool(host='127.0.0.1', port=1): Read timed out. (read timeout=60.0)")
        except ReadTimeout:
            raise ValueError("Error trying to open what seems to be a URI: 'https://127.0.0.1:1/a'\nIn order to open "
                             "URLs/URIs please run 'pip install smart_open'")  # lhotse's words for any failure
    except ValueError as err:
        assert remote.failure(err) == ("no answer within 60 s (ReadTimeout: HTTPSConnectionPool(host='127.0.0.1', "
                                       "port=1): Read timed out. (read timeout=60.0))")
