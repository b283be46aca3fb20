"""What NCCL does with each environment variable: when it reads it (once per process, or at every
communicator), its default and values, what it changes, and which frameworks set it themselves.

Facts come from NVIDIA/nccl sources of 2.18.1 through 2.30.7 (cited per entry as nccl@<tag>:<path>)
and from the framework sources named in each override; shared/reference/nccl-internals.md has the
full notes. The rules ask `is_process_cached(var, version)`; commands/explain.py shows an entry to a user.
"""
from __future__ import annotations

import difflib
import functools
from dataclasses import dataclass

# How NCCL reads a variable (one value per version range).
PROCESS = "process"              # first read wins for the process (per loaded libnccl copy)
PROCESS_APPLIED = "process, re-applied per comm"  # cached, then copied into every comm's config
COMM = "comm"                    # re-read at every communicator init
PLUGIN = "plugin load"           # read when the plugin loads (refcounted: the first communicator)
NET_INIT = "network init"        # read when the network transport initialises (once per process)
MODES = (PROCESS, PROCESS_APPLIED, COMM, PLUGIN, NET_INIT)
_CACHED = {PROCESS: True, PROCESS_APPLIED: True, PLUGIN: True, NET_INIT: True, COMM: False}

NO_CACHE_SINCE = 22907  # NCCL_NO_CACHE lifts the NCCL_PARAM cache from 2.29.7 (src/misc/param.cc)


def version_code(text: str | int | None) -> int | None:
    """'2.27.5' / '2.27.5-1' / 22705 -> 22705 (NCCL_VERSION_CODE); None if unparsable."""
    if text is None or isinstance(text, int):
        return text
    parts = text.strip().lstrip("v").split("-")[0].split("+")[0].split(".")
    try:
        major, minor, patch = (int(p) for p in (parts + ["0", "0"])[:3])
    except ValueError:
        return None
    return major * 10000 + minor * 100 + patch


def version_text(code: int) -> str:
    return "≤2.18" if code == 0 else f"{code // 10000}.{code // 100 % 100}.{code % 100}"


@dataclass(frozen=True)
class Reading:
    since: int          # first NCCL_VERSION_CODE with this behaviour (0: 2.18 or earlier)
    mode: str           # one of MODES
    how: str            # mechanism and where, e.g. "NCCL_PARAM, src/graph/connect.cc"

    @property
    def cached(self) -> bool:
        """NCCL keeps the first value it read for the process (else it re-reads it per communicator)."""
        return _CACHED[self.mode]


@dataclass(frozen=True)
class Override:
    framework: str
    action: str         # what it does to the variable
    where: str          # file / function
    source: str


@dataclass(frozen=True)
class VarInfo:
    name: str
    category: str
    affects: str
    default: str
    values: str
    readings: tuple[Reading, ...]
    source: str
    param: bool = False         # an NCCL_PARAM: NCCL_NO_CACHE can lift its cache (2.29.7+)
    overrides: tuple[Override, ...] = ()
    notes: str = ""

    @property
    def since(self) -> int:
        return self.readings[0].since

    def reading(self, version: int | None = None) -> Reading | None:
        """The behaviour of that NCCL version (newest known when None); None if it does not read it."""
        if version is None:
            return self.readings[-1]
        found = None
        for r in self.readings:
            if version >= r.since:
                found = r
        return found

    def to_json(self) -> dict:
        return {"name": self.name, "category": self.category, "affects": self.affects,
                "default": self.default, "values": self.values, "since": version_text(self.since),
                "process_cached": _CACHED[self.readings[-1].mode],
                "readings": [{"since": version_text(r.since), "mode": r.mode, "process_cached": _CACHED[r.mode],
                              "how": r.how} for r in self.readings],
                "no_cache_applies": self.param, "notes": self.notes, "source": self.source,
                "overrides": [o.__dict__ for o in self.overrides]}


def _p(name, category, affects, default, values, how, source, since=0, **kw) -> VarInfo:
    """An NCCL_PARAM read once per process."""
    return VarInfo(name, category, affects, default, values, (Reading(since, PROCESS, how),), source,
                   param=True, **kw)


def _applied(name, category, affects, default, values, field_, source, since=0, log_since=22809, **kw) -> VarInfo:
    how = (f"NCCL_PARAM, then envConfigOverride copies it into comm->config.{field_} at every init and split, "
           f"overriding the caller's ncclConfig_t (src/init.cc)")
    notes = kw.pop("notes", "")
    notes = (notes + " " if notes else "") + (f"Logged as 'Comm config {field_} reset to {name}=…' "
                                               f"from {version_text(log_since)}.")
    return VarInfo(name, category, affects, default, values, (Reading(since, PROCESS_APPLIED, how),), source,
                   param=True, notes=notes, **kw)


def _one(name, category, affects, default, values, mode, how, source, since=0, **kw) -> VarInfo:
    return VarInfo(name, category, affects, default, values, (Reading(since, mode, how),), source, **kw)


_SGLANG = "sglang 0.5.23 wheel, srt/entrypoints/engine.py::_set_envs_and_config"
_SGLANG_DET = "sglang 0.5.23 wheel, srt/server_args arg_groups/attention_hook.py (deterministic inference)"
_VLLM_PIN = "vllm 0.33.0 sdist, vllm/utils/nccl.py::pin_nccl_env"
_VLLM_ENV = "vllm source, vllm/env_override.py (earlier releases: vllm/__init__.py, worker_base.py init_worker)"
_VERL = "verl source, verl/trainer/constants_ppo.py PPO_RAY_RUNTIME_ENV (releases vary)"
_RAY = "ray source, ray/train/torch/config.py::_set_nccl_network_interface, ray/train/constants.py"

# NCCL_PROTO and NCCL_ALGO are read in the same place, on every communicator init
_TUNE_MODEL = (Reading(0, COMM, "getenv in ncclTopoTuneModel at every comm init (src/graph/tuning.cc)"),
               Reading(21900, COMM, "ncclGetEnv in ncclTopoTuneModel at every comm init (src/graph/tuning.cc)"))

_VARS: tuple[VarInfo, ...] = (
    VarInfo("NCCL_PROTO", "tuning", "protocol of every collective (LL, LL128, Simple)",
            "unset: NCCL's cost model picks per size; LL128 only where NCCL deems it safe (not on PCIe)",
            "LL, LL128, Simple; comma list; ^ excludes (\"^LL128\"); per function from 2.24 "
            "(\"allreduce:LL;broadcast:Simple\")",
            _TUNE_MODEL,
            "nccl@v2.18.1-1..v2.30.7-1:src/graph/tuning.cc", param=False,
            overrides=(Override("vLLM", "lists pinned variables in NCCL_NO_CACHE so they are re-read per comm",
                                "vllm/utils/nccl.py::pin_nccl_env", _VLLM_PIN),),
            notes="Each comm logs 'NCCL_PROTO set by environment to …'. From 2.24 rank 0 also prints the "
                  "'Enabled NCCL Func/Proto/Algo Matrix' when NCCL_PROTO or NCCL_ALGO is set."),
    VarInfo("NCCL_ALGO", "tuning", "algorithm of every collective",
            "unset: NCCL's cost model picks per size and topology",
            "Ring, Tree, CollNetDirect, CollNetChain, NVLS, NVLSTree, PAT (2.23+); comma list; ^ excludes; "
            "per function from 2.24 (\"allreduce:tree\")",
            _TUNE_MODEL,
            "nccl@v2.18.1-1..v2.30.7-1:src/graph/tuning.cc",
            overrides=(Override("SGLang", "deterministic inference sets NCCL_ALGO=allreduce:tree",
                                "arg_groups/attention_hook.py", _SGLANG_DET),)),
    _p("NCCL_MIN_NCHANNELS", "tuning", "lower bound on channels (parallel rings/trees, one CTA each)",
       "-2 (auto)", "integer ≥ 1", "NCCL_PARAM MinNchannels, src/graph/connect.cc",
       "nccl@v2.30.7-1:src/graph/connect.cc",
       overrides=(Override("SGLang", "deterministic inference sets NCCL_MIN_NCHANNELS",
                           "arg_groups/attention_hook.py", _SGLANG_DET),)),
    _p("NCCL_MAX_NCHANNELS", "tuning", "upper bound on channels used by collectives",
       "-2 (auto)", "integer 1..64 (MAXCHANNELS)", "NCCL_PARAM MaxNchannels, src/graph/connect.cc",
       "nccl@v2.30.7-1:src/graph/connect.cc; nccl@v2.28.9-1:src/include/device.h (MAXCHANNELS 64)",
       overrides=(Override("SGLang", "deterministic inference sets NCCL_MAX_NCHANNELS",
                           "arg_groups/attention_hook.py", _SGLANG_DET),)),
    _applied("NCCL_MIN_CTAS", "tuning", "minimum CTAs (channels) per comm; config.minCTAs", "unset (config default)",
             "integer ≥ 1", "minCTAs", "nccl@v2.30.7-1:src/init.cc (envConfigOverride)", since=21700),
    _applied("NCCL_MAX_CTAS", "tuning", "maximum CTAs (channels) per comm; config.maxCTAs", "unset (config default)",
             "integer ≥ 1", "maxCTAs", "nccl@v2.30.7-1:src/init.cc (envConfigOverride)", since=21700,
             overrides=(Override("vLLM", "sets NCCL_MAX_CTAS=8 at runtime for EPLB (relies on NCCL_NO_CACHE to "
                                 "reach later comms)", "eplb/eplb_utils.py", "vllm 0.33.0 sdist, eplb/eplb_utils.py"),)),
    _p("NCCL_BUFFSIZE", "tuning", "Simple-protocol buffer per channel and peer", "4194304 (4 MiB)",
       "bytes, integer", "NCCL_PARAM BuffSize, src/init.cc", "nccl@v2.30.7-1:src/init.cc"),
    _p("NCCL_LL_BUFFSIZE", "tuning", "LL-protocol buffer per channel and peer", "-2 (derived from LL line size)",
       "bytes, integer", "NCCL_PARAM LlBuffSize, src/init.cc", "nccl@v2.30.7-1:src/init.cc"),
    _p("NCCL_LL128_BUFFSIZE", "tuning", "LL128-protocol buffer per channel and peer",
       "-2 (derived from LL128 line size)", "bytes, integer", "NCCL_PARAM Ll128BuffSize, src/init.cc",
       "nccl@v2.30.7-1:src/init.cc"),
    _p("NCCL_NTHREADS", "tuning", "threads per CTA for Simple/LL", "512 (256 on slow PCIe rings)",
       "64, 128, 256, 512", "NCCL_PARAM Nthreads, src/graph/tuning.cc", "nccl@v2.30.7-1:src/graph/tuning.cc"),
    _p("NCCL_LL128_NTHREADS", "tuning", "threads per CTA for LL128", "auto (NCCL_LL128_MAX_NTHREADS = 640)",
       "multiple of 32, ≤ 640", "NCCL_PARAM Ll128Nthreads, src/graph/tuning.cc", "nccl@v2.30.7-1:src/graph/tuning.cc"),
    _one("NCCL_P2P_LEVEL", "transport", "farthest topology distance at which GPUs use P2P between them",
         "auto (NCCL's per-platform choice)", "LOC, NVL, NVB, C2C, PIX, PXB, P2C, PXN, PHB, SYS; or 0..5 (old numbering)", PROCESS,
         "static global ncclTopoUserP2pLevel, set at first use (src/graph/paths.cc); NCCL_NO_CACHE has no effect",
         "nccl@v2.30.7-1:src/graph/paths.cc",
         notes="Logged as 'NCCL_P2P_LEVEL set by environment to …' (no trailing period)."),
    _one("NCCL_P2P_DISABLE", "transport", "disables P2P between GPUs (same cache as NCCL_P2P_LEVEL)", "0",
         "0, 1", PROCESS, "static global ncclTopoUserP2pLevel (src/graph/paths.cc)",
         "nccl@v2.30.7-1:src/graph/paths.cc"),
    _p("NCCL_SHM_DISABLE", "transport", "disables the shared-memory transport", "0", "0, 1",
       "NCCL_PARAM ShmDisable, src/transport/shm.cc", "nccl@v2.30.7-1 (NCCL_PARAM)"),
    _p("NCCL_IB_DISABLE", "transport", "disables the InfiniBand/RoCE transport (falls back to sockets)", "0",
       "0, 1", "NCCL_PARAM IbDisable, src/transport/net_ib.cc", "nccl@v2.30.7-1 (NCCL_PARAM)"),
    _one("NCCL_NET_GDR_LEVEL", "transport", "farthest NIC-GPU distance at which GPUDirect RDMA is used",
         "auto", "LOC, PIX, PXB, PHB, SYS (or 0..5)", PROCESS,
         "static global ncclTopoUserGdrLevel (src/graph/paths.cc)", "nccl@v2.30.7-1:src/graph/paths.cc"),
    _p("NCCL_NET_GDR_READ", "transport", "GPUDirect RDMA for sends (reads from GPU memory)", "-2 (auto)", "0, 1",
       "NCCL_PARAM NetGdrRead, src/graph/paths.cc", "nccl@v2.28.9-1:src/graph/paths.cc"),
    _p("NCCL_PXN_DISABLE", "transport", "disables PXN (send through a peer GPU's NIC over NVLink)", "0", "0, 1",
       "NCCL_PARAM PxnDisable", "nccl@v2.30.7-1 (NCCL_PARAM)"),
    _p("NCCL_NVLS_ENABLE", "transport", "NVLink SHARP (NVLS) algorithms and their memory", "2 (auto)", "0, 1, 2",
       "NCCL_PARAM NvlsEnable, src/transport/nvls.cc", "nccl@v2.28.9-1:src/transport/nvls.cc", since=21700,
       overrides=(Override("SGLang", "sets NCCL_NVLS_ENABLE in the engine process before workers start",
                           "entrypoints/engine.py::_set_envs_and_config", _SGLANG),)),
    VarInfo("NCCL_CUMEM_ENABLE", "memory", "cuMem* (VMM) allocations for NCCL buffers",
            "0 in 2.18; -2 (auto, on where supported) from 2.19", "0, 1",
            (Reading(21800, PROCESS, "NCCL_PARAM CuMemEnable (default 0), src/misc/cudawrap.cc"),
             Reading(21900, PROCESS, "NCCL_PARAM CuMemEnable (default -2), src/misc/cudawrap.cc")),
            "nccl@v2.18.1-1, v2.19.3-1:src/misc/cudawrap.cc", param=True,
            overrides=(Override("SGLang", "sets NCCL_CUMEM_ENABLE in the engine process",
                                "entrypoints/engine.py::_set_envs_and_config", _SGLANG),
                       Override("vLLM", "sets NCCL_CUMEM_ENABLE=0 at import unless already non-zero or "
                                "multi-node NVLink (/dev/nvidia-caps-imex-channels)", "vllm/env_override.py",
                                _VLLM_ENV),
                       Override("verl", "Ray runtime env of the PPO trainer sets NCCL_CUMEM_ENABLE=0",
                                "verl/trainer/constants_ppo.py", _VERL))),
    _p("NCCL_CROSS_NIC", "transport", "whether rings/trees may use different NICs on the two ends", "2 (auto)",
       "0, 1, 2", "NCCL_PARAM CrossNic", "nccl@v2.28.9-1 (NCCL_PARAM)"),
    VarInfo("NCCL_COLLNET_ENABLE", "transport", "CollNet (in-network reduction, e.g. SHARP) algorithms",
            "unset (off)", "0, 1",
            (Reading(0, COMM, "getenv/ncclGetEnv at every comm init (src/init.cc)"),
             Reading(22700, PROCESS_APPLIED, "NCCL_PARAM CollnetEnable copied into comm->config.collnetEnable"),
             Reading(22705, COMM, "ncclGetEnv at every comm init: 'needs to be reloaded each time' (src/init.cc)")),
            "nccl@v2.26.2-1, v2.27.3-1, v2.27.5-1, v2.30.7-1:src/init.cc", param=False,
            notes="2.27.0–2.27.4 cached it per process; 2.27.5 went back to re-reading it per comm."),
    _one("NCCL_NET", "transport", "which network plugin/transport (e.g. IB, Socket)", "auto", "network name",
         COMM, "ncclGetEnv at every comm init; overrides config.netName ('Comm config netName reset to NCCL_NET')",
         "nccl@v2.30.7-1:src/init.cc"),
    _one("NCCL_SOCKET_IFNAME", "transport", "network interfaces for bootstrap and the socket transport",
         "auto (prefers non-docker, non-loopback)", "prefix list, ^ excludes, = exact (\"=eth0\")", NET_INIT,
         "read when the bootstrap/socket network initialises; once per process [UNVERIFIED]",
         "shared/reference/nccl-internals.md §1.3",
         overrides=(Override("Ray Train", "sets NCCL_SOCKET_IFNAME=\"^lo,docker,veth\" (older: \"en,eth,bond\") "
                             "when unset, in each worker", "ray/train/torch/config.py", _RAY),)),
    _one("NCCL_IB_HCA", "transport", "which InfiniBand/RoCE devices and ports", "auto (all)",
         "prefix list, ^ excludes, = exact, :port", NET_INIT, "read when the IB transport initialises; once per "
         "process [UNVERIFIED]", "shared/reference/nccl-internals.md §1.3"),
    _one("NCCL_DEBUG", "debug", "log level of NCCL's own output", "unset (no output)",
         "VERSION, WARN, INFO, ABORT, TRACE", PROCESS, "read once in ncclDebugInit (src/debug.cc)",
         "nccl@v2.28.9-1:src/debug.cc",
         overrides=(Override("verl", "Ray runtime env of the PPO trainer sets NCCL_DEBUG=WARN (hides INFO logs)",
                             "verl/trainer/constants_ppo.py", _VERL),)),
    _one("NCCL_DEBUG_SUBSYS", "debug", "subsystems logged at INFO", "INIT,ENV (≤2.22); INIT,BOOTSTRAP,ENV (2.23+)",
         "INIT COLL P2P SHM NET GRAPH TUNING ENV ALLOC CALL PROXY NVLS BOOTSTRAP REG PROFILE RAS DESTROY ALL; "
         "^ inverts", PROCESS, "read once in ncclDebugInit (src/debug.cc)", "nccl@v2.28.9-1:src/debug.cc"),
    _one("NCCL_DEBUG_FILE", "debug", "file for NCCL's log instead of stdout", "unset (stdout)",
         "path; %h host, %p pid, %% percent", PROCESS,
         "read once in ncclDebugInit; opened with mode \"w\" only when the level is above VERSION (src/debug.cc)",
         "nccl@v2.28.9-1:src/debug.cc"),
    _one("NCCL_CONF_FILE", "config", "conf file read instead of ~/.nccl.conf (/etc/nccl.conf still read after)",
         "unset (~/.nccl.conf, home from getpwuid)", "path (~ is not expanded)", PROCESS,
         "read once in initEnv at NCCL's first variable lookup; lines applied with setenv(…, 0)",
         "nccl@v2.23.4-1, v2.28.9-1:src/misc/param.cc", since=22300,
         notes="Conf values never override a variable already in the environment; they enter the live "
               "environment (visible in os.environ afterwards), never /proc/<pid>/environ."),
    _one("NCCL_TOPO_FILE", "config", "XML topology NCCL loads instead of probing", "unset", "path", COMM,
         "read at every comm init (src/graph/topo.cc)", "shared/reference/nccl-internals.md §1.3"),
    _one("NCCL_GRAPH_FILE", "config", "XML graph (rings/trees) NCCL loads instead of searching", "unset", "path",
         COMM, "read at every comm init (src/graph/search.cc)", "shared/reference/nccl-internals.md §1.3"),
    _one("NCCL_LAUNCH_MODE", "config", "kernel launch for multiple devices per process", "PARALLEL", "PARALLEL, GROUP", COMM,
         "ncclGetEnv at every comm init (by the comm's first local rank), stored in a process-wide global "
         "(src/init.cc): the last comm's read wins for all", "nccl@v2.28.9-1:src/init.cc"),
    _applied("NCCL_CGA_CLUSTER_SIZE", "tuning", "CUDA thread-block cluster size of NCCL kernels (sm90+)",
             "auto", "0..8", "cgaClusterSize", "nccl@v2.28.9-1:src/init.cc", since=21600),
    _applied("NCCL_COMM_BLOCKING", "config", "whether NCCL calls block (config.blocking)", "1 (blocking)", "0, 1",
             "blocking", "nccl@v2.30.7-1:src/init.cc", since=21400),
    VarInfo("NCCL_CTA_POLICY", "tuning", "CTA policy (DEFAULT, EFFICIENCY, ZERO) of kernels; config.CTAPolicy",
            "unset (DEFAULT)", "0 DEFAULT, 1 EFFICIENCY, 2 ZERO (flags in 2.30)",
            (Reading(22700, PROCESS_APPLIED, "NCCL_PARAM CtaPolicy copied into comm->config.CTAPolicy (src/init.cc)"),
             Reading(23000, PROCESS_APPLIED, "read once (std::once_flag), copied into comm->config.CTAPolicy "
                                             "(src/init.cc)")),
            "nccl@v2.27.3-1, v2.30.7-1:src/init.cc", param=False,
            notes="Logged as 'Comm config CTAPolicy reset to NCCL_CTA_POLICY=…'."),
    _one("NCCL_PROFILER_PLUGIN", "plugin", "profiler plugin library (per-comm init, per-collective events)",
         "unset (libnccl-profiler.so if present)", "path or name (libnccl-profiler-<name>.so); none disables",
         PLUGIN, "read when the profiler plugin loads (refcounted: first comm) (src/plugin/profiler.cc)",
         "nccl@v2.30.7-1:src/plugin/profiler.cc, src/plugin/plugin_open.cc", since=22300),
    _one("NCCL_TUNER_PLUGIN", "plugin", "tuner plugin library (overrides algo/proto/channel choices)",
         "unset (libnccl-tuner.so if present)", "path or name (libnccl-tuner-<name>.so); none disables",
         PLUGIN, "read when the tuner plugin loads (refcounted: first comm) (src/plugin/tuner.cc)",
         "nccl@v2.28.9-1:src/plugin/tuner.cc", since=21900),
    _one("NCCL_ENV_PLUGIN", "plugin", "env plugin library: every NCCL variable lookup goes through it",
         "unset (built-in getenv)", "path or name; none disables", PROCESS,
         "plain getenv once, when NCCL first looks up a variable (src/plugin/env.cc)",
         "nccl@v2.28.7-1:src/misc/param.cc; nccl@v2.28.9-1, v2.30.7-1:src/plugin/env.cc", since=22807),
    _one("NCCL_NO_CACHE", "config", "NCCL_PARAM keys re-read on every use instead of cached",
         "unset", "comma list of keys, or ALL", PROCESS,
         "parsed once; logs 'Disabling caching for environment variable …' (src/misc/param.cc, src/param/param.cc)",
         "nccl@v2.29.7-1:src/misc/param.cc; nccl@v2.30.7-1:src/param/param.cc", since=NO_CACHE_SINCE,
         overrides=(Override("vLLM", "sets NCCL_NO_CACHE to its pinned NCCL variables",
                             "vllm/utils/nccl.py::pin_nccl_env", _VLLM_PIN),),
         notes="Marked private in NCCL's docs. Does not cover hand-written caches such as NCCL_P2P_LEVEL."),
    VarInfo("NCCL_GRAPH_MIXING_SUPPORT", "config", "support for mixing graph-captured and eager NCCL calls",
            "1", "0, 1",
            (Reading(21400, PROCESS, "NCCL_PARAM GraphMixingSupport"),
             Reading(22900, PROCESS_APPLIED, "NCCL_PARAM, copied into comm->config.graphUsageMode at every init "
                                             "('Comm config graphUsageMode reset to … by NCCL_GRAPH_MIXING_SUPPORT')")),
            "nccl@v2.28.9-1, v2.29.7-1:src/init.cc", param=True,
            overrides=(Override("SGLang", "sets NCCL_GRAPH_MIXING_SUPPORT (0 with decode context parallel)",
                                "entrypoints/engine.py::_set_envs_and_config", _SGLANG),)),
    _applied("NCCL_COMM_SPLIT_SHARE_RESOURCES", "config", "whether split children share the parent's resources",
             "0", "0, 1", "splitShare", "nccl@v2.28.9-1:src/init.cc", since=21800),
    _applied("NCCL_NVLS_NCHANNELS", "tuning", "channels (CTAs) for NVLS algorithms; config.nvlsCTAs", "auto",
             "integer", "nvlsCTAs", "nccl@v2.28.9-1:src/init.cc", since=22700),
    _applied("NCCL_NCHANNELS_PER_NET_PEER", "tuning", "channels per network peer; config.nChannelsPerNetPeer",
             "auto", "integer", "nChannelsPerNetPeer", "nccl@v2.28.9-1:src/init.cc", since=22800),
    _one("NCCL_COMM_ID", "config", "bootstrap root address used by ncclGetUniqueId instead of a local listener",
         "unset", "host:port", COMM, "ncclGetEnv at every ncclGetUniqueId (src/init.cc)",
         "nccl@v2.28.9-1:src/init.cc"),
)

CATALOG: dict[str, VarInfo] = {v.name: v for v in _VARS}


def _normalise(var: str) -> str:
    name = var.strip().split("=", 1)[0].strip().upper()
    if name and name not in CATALOG and "NCCL_" + name in CATALOG:
        return "NCCL_" + name
    return name


def get(var: str) -> VarInfo | None:
    return CATALOG.get(_normalise(var)) if isinstance(var, str) else None


def is_process_cached(var: str, version: int | str | None = None, *, no_cache: str | None = None) -> bool | None:
    """True if NCCL keeps the first value it read for the whole process (later os.environ changes do
    not reach new communicators); False if it re-reads it per communicator; None if unknown or not
    read by that version. `no_cache` is the process's NCCL_NO_CACHE value (2.29.7+ lifts NCCL_PARAM
    caches for the keys it lists)."""
    if type(var) is str and (version is None or type(version) in (int, str)) and (no_cache is None or type(no_cache) is str):
        return _process_cached(var, version, no_cache)  # a pure function of the catalog: asked ~70 times a process
    return _is_process_cached(var, version, no_cache)


def _is_process_cached(var: str, version: int | str | None, no_cache: str | None) -> bool | None:
    info = get(var)
    code = version_code(version) if isinstance(version, str) else version
    if info is None or (version is not None and code is None):
        return None
    reading = info.reading(code)
    if reading is None:
        return None
    cached = _CACHED[reading.mode]
    if cached and no_cache and info.param and (code is None or code >= NO_CACHE_SINCE):
        keys = {k.strip().upper() for k in no_cache.split(",")}
        if "ALL" in keys or info.name in keys or info.name.removeprefix("NCCL_") in keys:
            return False
    return cached


_process_cached = functools.lru_cache(maxsize=1 << 14)(_is_process_cached)


def suggest(name: str, n: int = 5) -> list[str]:
    """Nearest catalog names to a misspelt one."""
    query = (name or "").strip().split("=", 1)[0].upper()
    if not query:
        return []
    names = list(CATALOG)
    bare = {k.removeprefix("NCCL_"): k for k in names}
    found = difflib.get_close_matches(query, names, n=n, cutoff=0.75)
    found += [bare[b] for b in difflib.get_close_matches(query.removeprefix("NCCL_"), list(bare), n=n, cutoff=0.75)]
    core = query.removeprefix("NCCL_")
    found += [k for k in names if len(core) >= 3 and core in k]
    return list(dict.fromkeys(found))[:n]
