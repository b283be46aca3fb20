from ncclprobe.model import tuning


def test_proto_selector_forms():
    assert tuning.proto_allowed("LL") == {"LL"}
    assert tuning.proto_allowed("ll,simple") == {"LL", "Simple"}
    assert tuning.proto_allowed("^LL128") == {"LL", "Simple"}
    assert tuning.proto_allowed("allreduce:LL128;allgather:Simple") == {"LL128"}
    assert tuning.proto_allowed("allgather:Simple") is None
    assert tuning.proto_allowed(None) is None and tuning.proto_allowed(" ") is None
    assert tuning.algo_allowed("allreduce:tree,ring") == {"Tree", "Ring"}
