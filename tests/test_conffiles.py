"""nccl.conf resolution and parsing, as NCCL's initEnv does it, inside the process's own root."""
from io import StringIO

from ncclprobe.witnesses import conffiles

from ncclprobe import render
from ncclprobe.commands.inspection import inspect_processes
from fakeproc import FailingReader, FakeProc


def files(tree: dict[str, str]):
    def read_text(path):
        if path not in tree:
            raise FileNotFoundError(2, path)
        return tree[path]
    return read_text


PASSWD = "root:x:0:0:root:/root:/bin/bash\nsrv:x:1000:1000::/home/srv:/bin/sh\n"


def test_parse_is_literal_like_setEnvFile():
    text = "NCCL_PROTO=LL\n#NCCL_ALGO=Tree\nnoequals\n NCCL_X=1\nexport NCCL_Y=2\nNCCL_Z= spaced \nNCCL_EQ=a=b"
    got = {(n, v) for _, n, v, _ in conffiles.parse(text)}
    assert ("NCCL_PROTO", "LL") in got and ("NCCL_EQ", "a=b") in got
    assert (" NCCL_X", "1") in got and ("export NCCL_Y", "2") in got and ("NCCL_Z", " spaced ") in got
    assert not any(n.startswith("#") for n, _ in got)
    # before 2.26 a '#' line is not a comment: it sets a variable named "#NCCL_ALGO"
    assert ("#NCCL_ALGO", "Tree") in {(n, v) for _, n, v, _ in conffiles.parse(text, comments=False)}
    notes = {n: note for _, n, _, note in conffiles.parse(text)}
    assert "literally" in notes["export NCCL_Y"] and "spaces" in notes["NCCL_Z"]


def test_precedence_env_then_user_file_then_etc():
    fs = files({"/etc/passwd": PASSWD,
                "/home/srv/.nccl.conf": "NCCL_PROTO=Simple\nNCCL_ALGO=Tree\n",
                "/etc/nccl.conf": "NCCL_ALGO=Ring\nNCCL_DEBUG=WARN\n"})
    out = conffiles.applicable({"NCCL_PROTO": "LL"}, 1000, "2.32.3", fs)
    effects = {(f.role, e.var): e.effect for f in out for e in f.entries}
    assert effects[("~/.nccl.conf", "NCCL_PROTO")] == "env wins"
    assert effects[("~/.nccl.conf", "NCCL_ALGO")] == "applies"
    assert effects[("/etc/nccl.conf", "NCCL_ALGO")] == "earlier file wins"
    assert effects[("/etc/nccl.conf", "NCCL_DEBUG")] == "applies"


def test_nccl_conf_file_replaces_home_file_since_2_23():
    fs = files({"/etc/passwd": PASSWD, "/home/srv/.nccl.conf": "NCCL_ALGO=Tree\n",
                "/cfg/my.conf": "NCCL_ALGO=Ring\n", "/srv/rel.conf": "NCCL_PROTO=LL\n"})
    env = {"NCCL_CONF_FILE": "/cfg/my.conf"}
    roles = [f.role for f in conffiles.applicable(env, 1000, "2.23.4", fs) if f.exists]
    assert roles == ["NCCL_CONF_FILE"]
    old = conffiles.applicable(env, 1000, "2.22.3", fs)
    assert [f.role for f in old if f.exists] == ["~/.nccl.conf"]
    assert any(f.role == "NCCL_CONF_FILE" and "2.23" in (f.reason or "") for f in old)
    rel = conffiles.applicable({"NCCL_CONF_FILE": "rel.conf"}, 1000, None, fs, cwd="/srv")
    assert rel[0].path == "/srv/rel.conf" and rel[0].entries[0].effect == "applies"


def test_unreadable_environment_makes_effects_unknown():
    fs = files({"/etc/nccl.conf": "NCCL_ALGO=Ring\n"})
    out = conffiles.applicable(None, None, None, fs)
    assert out[-1].entries[0].effect == "unknown"


def test_home_from_the_process_uid():
    assert conffiles.home_of(1000, files({"/etc/passwd": PASSWD})) == "/home/srv"
    assert conffiles.home_of(4242, files({"/etc/passwd": PASSWD})) is None
    assert conffiles.home_of(0, files({})) is None


def test_inspect_resolves_conf_inside_the_container_root(tmp_path):
    """The container's /etc/nccl.conf applies, not the host's, and only to its processes."""
    rootfs = tmp_path / "rootfs"
    (rootfs / "etc").mkdir(parents=True)
    (rootfs / "home" / "srv").mkdir(parents=True)
    (rootfs / "etc" / "passwd").write_text(PASSWD)
    (rootfs / "etc" / "nccl.conf").write_text("NCCL_ALGO=Ring\nNCCL_PROTO=Simple\n")
    (rootfs / "home" / "srv" / ".nccl.conf").write_text("NCCL_MAX_NCHANNELS=4\n")
    fake = FakeProc(tmp_path)
    fake.add(10, 1, cmdline=["python", "serve.py"], env={"NCCL_PROTO": "LL"}, root=str(rootfs), uid=1000,
             fds=["/dev/nvidia0"])
    res = inspect_processes([10], proc_root=fake.root, reader=fake.reader(),
                            gpu_lookup=lambda: ({}, "no NVML in this test"))
    proc = res.data["processes"][0]
    confs = {c["role"]: c for c in proc["conf_files"]}
    assert confs["/etc/nccl.conf"]["path"] == "/etc/nccl.conf"
    assert {e["var"]: e["effect"] for e in confs["/etc/nccl.conf"]["entries"]} == \
        {"NCCL_ALGO": "applies", "NCCL_PROTO": "env wins"}
    conf_findings = {(f.var, f.evidence["file"]) for f in res.findings if f.code == "CONF_FILE_VALUE"}
    # the environment's NCCL_PROTO=LL shadowing the file's Simple is named too, with the value NCCL uses
    assert conf_findings == {("NCCL_ALGO", "/etc/nccl.conf"), ("NCCL_MAX_NCHANNELS", "/home/srv/.nccl.conf"),
                             ("NCCL_PROTO", "/etc/nccl.conf")}
    (shadow,) = [f for f in res.findings if f.code == "CONF_FILE_VALUE" and f.var == "NCCL_PROTO"]
    assert shadow.evidence["environment"] == "LL" and shadow.evidence["value"] == "Simple" and "shadows" in shadow.message
    assert all(f.severity == "info" for f in res.findings if f.code == "CONF_FILE_VALUE")


def failing(tree: dict[str, str], refused: dict[str, OSError]):
    def read_text(path):
        if path in refused:
            raise refused[path]
        return files(tree)(path)
    return read_text


def test_a_missing_file_is_absent_and_a_refusal_claims_only_what_it_knows():
    """ENOENT: absent (not listed); EACCES: refused, existence unknown; NotVisible: the process's root is
    out of sight, so is its home; any other error: the file is there but unreadable."""
    fs = failing({"/etc/passwd": PASSWD}, {"/home/srv/.nccl.conf": PermissionError(13, "Permission denied"),
                                            "/etc/nccl.conf": OSError(5, "Input/output error")})
    home, etc = conffiles.applicable({}, 1000, None, fs)
    assert (home.exists, home.reason) == (None, "cannot be read: permission denied")
    assert (etc.exists, etc.reason) == (True, "unreadable: Input/output error")
    (absent,) = conffiles.applicable({}, 1000, None, files({"/etc/passwd": "srv:x:1000:1000::/h:/bin/sh\n"}))[1:]
    assert (absent.exists, absent.reason) == (False, None)

    def unseen(path):
        raise conffiles.NotVisible("pid 7's root (/proc/7/root) cannot be entered (permission)")
    out = conffiles.applicable(None, 1000, None, unseen)
    assert [(f.role, f.exists) for f in out] == [("~/.nccl.conf", None), ("/etc/nccl.conf", None)]
    assert all(f.reason.startswith("cannot tell whether it exists: pid 7's root") for f in out)


def test_describe_names_a_path_once():
    etc = conffiles.ConfFile("/etc/nccl.conf", "/etc/nccl.conf", None, "cannot be read: permission denied")
    assert conffiles.describe(etc.to_json()) == "/etc/nccl.conf: cannot be read: permission denied"
    home = conffiles.ConfFile("/root/.nccl.conf", "~/.nccl.conf", True,
                              entries=(conffiles.ConfEntry("NCCL_ALGO", "Ring", 1, "applies"),))
    assert conffiles.describe(home.to_json()) == "~/.nccl.conf /root/.nccl.conf: NCCL_ALGO=Ring"


def test_inspect_files_behind_a_refused_root_are_of_unknown_existence(tmp_path):
    """`inspect 1` as root where /proc/1/root is refused: the files in that root are not known to exist."""
    empty = tmp_path / "emptyroot"
    empty.mkdir()
    fake = FakeProc(tmp_path)
    fake.add(10, 1, cmdline=["init"], env={"NCCL_PROTO": "LL"}, root=str(empty), uid=0)
    res = inspect_processes([10], scope="all", proc_root=fake.root, gpu_lookup=lambda: ({}, "no NVML in this test"),
                            reader=FailingReader({(10, "root"): PermissionError}))
    confs = res.data["processes"][0]["conf_files"]
    assert [(c["role"], c["exists"]) for c in confs] == [("~/.nccl.conf", None), ("/etc/nccl.conf", None)]
    assert all("pid 10's root (/proc/10/root) cannot be entered (permission)" in c["reason"] for c in confs)
    out = StringIO()
    render.render_text(res, out, width=200, color=False)
    lines = [line for line in out.getvalue().splitlines() if "nccl.conf" in line]
    assert len(lines) == 2 and not [line for line in lines if "Permission denied" in line or line.count("/etc/nccl.conf") > 1]
