"""A worker process driving the simulated NCCL in one of two ways, from a JSON plan.

  --mode simtorch  calls libsimtorch.so (linked against libnccl.so.2, as libtorch_cuda.so is): its
                   NCCL calls go through the dynamic linker, so an LD_PRELOAD hook sees them.
  --mode ctypes    ctypes.CDLL(<path to the sim libnccl>) + getattr, as SGLang's and vLLM's PyNccl
                   wrappers do: no preload hook can see these calls.

Plan steps (JSON list): ["uid", HEX] | ["newuid"] | ["init", NAME, NRANKS, RANK] |
["initcfg", NAME, NRANKS, RANK, {"blocking", "minCTAs", "maxCTAs", "commName"}] |
["split", PARENT, NAME, COLOR, KEY] | ["allreduce", NAME, COUNT] | ["setenv", K, V] |
["cgetenv", K] | ["destroy", NAME] | ["info", NAME]. Results go to --out as one JSON object a line.
"""
import argparse
import ctypes
import json
import os
import sys


class UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * 128)]


class Config(ctypes.Structure):  # ncclConfig_t as nccl.h 2.28 declares it (80 bytes)
    _fields_ = [("size", ctypes.c_size_t), ("magic", ctypes.c_uint), ("version", ctypes.c_uint),
                ("blocking", ctypes.c_int), ("cgaClusterSize", ctypes.c_int), ("minCTAs", ctypes.c_int),
                ("maxCTAs", ctypes.c_int), ("netName", ctypes.c_char_p), ("splitShare", ctypes.c_int),
                ("trafficClass", ctypes.c_int), ("commName", ctypes.c_char_p), ("collnetEnable", ctypes.c_int),
                ("CTAPolicy", ctypes.c_int), ("shrinkShare", ctypes.c_int), ("nvlsCTAs", ctypes.c_int),
                ("nChannelsPerNetPeer", ctypes.c_int), ("nvlinkCentricSched", ctypes.c_int)]


UNDEF = -2147483648


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=["ctypes", "simtorch"], required=True)
    ap.add_argument("--lib-dir", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("plan")
    args = ap.parse_args()
    plan = json.loads(args.plan)
    libc = ctypes.CDLL(None)
    libc.getenv.restype = ctypes.c_char_p
    if args.mode == "simtorch":
        fw = ctypes.CDLL(os.path.join(args.lib_dir, "libsimtorch.so"))
        fw.simtorch_error_string.restype = ctypes.c_char_p
    else:
        nccl = ctypes.CDLL(os.path.join(args.lib_dir, "libnccl.so.2"))
    comms = {}
    uid = (ctypes.c_ubyte * 128)()
    out = open(args.out, "a")

    def emit(**kw):
        out.write(json.dumps(kw) + "\n")
        out.flush()

    for step in plan:
        op = step[0]
        if op == "uid":
            ctypes.memmove(uid, bytes.fromhex(step[1]), 128)
            emit(op=op, rc=0)
        elif op == "newuid":
            rc = fw.simtorch_get_unique_id(uid) if args.mode == "simtorch" else nccl.ncclGetUniqueId(uid)
            emit(op=op, rc=rc, uid=bytes(uid).hex())
        elif op in ("init", "initcfg"):
            name, nranks, rank = step[1], step[2], step[3]
            comm = ctypes.c_void_p()
            opts = step[4] if op == "initcfg" else None
            if args.mode == "simtorch":
                if opts is None:
                    rc = fw.simtorch_init_rank(ctypes.byref(comm), nranks, uid, rank)
                else:
                    cname = opts.get("commName")
                    rc = fw.simtorch_init_rank_config(ctypes.byref(comm), nranks, uid, rank, opts.get("blocking", -1),
                                                      opts.get("minCTAs", -1), opts.get("maxCTAs", -1),
                                                      cname.encode() if cname else None)
            else:
                cid = UniqueId()
                ctypes.memmove(cid.internal, uid, 128)
                if opts is None:
                    rc = nccl.ncclCommInitRank(ctypes.byref(comm), nranks, cid, rank)
                else:
                    cfg = Config(size=ctypes.sizeof(Config), magic=opts.get("magic", 0xCAFEBEEF), version=22809)
                    for f, _ in Config._fields_[3:]:
                        if f not in ("netName", "commName"):
                            setattr(cfg, f, UNDEF)
                    for k in ("blocking", "minCTAs", "maxCTAs"):
                        if k in opts:
                            setattr(cfg, k, opts[k])
                    if opts.get("commName"):
                        cfg.commName = opts["commName"].encode()
                    rc = nccl.ncclCommInitRankConfig(ctypes.byref(comm), nranks, cid, rank, ctypes.byref(cfg))
            comms[name] = comm
            emit(op=op, name=name, rc=rc)
        elif op == "split":
            child = ctypes.c_void_p()
            parent = comms[step[1]]
            if args.mode == "simtorch":
                rc = fw.simtorch_split(parent, step[3], step[4], ctypes.byref(child))
            else:
                rc = nccl.ncclCommSplit(parent, step[3], step[4], ctypes.byref(child), None)
            comms[step[2]] = child
            emit(op=op, name=step[2], rc=rc, null=child.value is None)
        elif op == "allreduce":
            n = step[2]
            send = (ctypes.c_float * max(n, 1))(*([1.5] * max(n, 1)))
            recv = (ctypes.c_float * max(n, 1))()
            if args.mode == "simtorch":
                rc = fw.simtorch_all_reduce(comms[step[1]], send, recv, ctypes.c_size_t(n), 7, 0)
            else:
                rc = nccl.ncclAllReduce(send, recv, ctypes.c_size_t(n), 7, 0, comms[step[1]], None)
            emit(op=op, name=step[1], rc=rc, first=recv[0])
        elif op == "setenv":
            os.environ[step[1]] = step[2]
            emit(op=op, rc=0)
        elif op == "cgetenv":
            v = libc.getenv(step[1].encode())
            emit(op=op, var=step[1], value=v.decode() if v is not None else None)
        elif op == "info":
            r, n, d = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
            if args.mode == "simtorch":
                rc = fw.simtorch_comm_info(comms[step[1]], ctypes.byref(r), ctypes.byref(n), ctypes.byref(d))
            else:
                rc = nccl.ncclCommUserRank(comms[step[1]], ctypes.byref(r)) or \
                    nccl.ncclCommCount(comms[step[1]], ctypes.byref(n))
            emit(op=op, rc=rc, rank=r.value, nranks=n.value, dev=d.value)
        elif op == "destroy":
            c = comms.pop(step[1])
            rc = fw.simtorch_destroy(c) if args.mode == "simtorch" else nccl.ncclCommDestroy(c)
            emit(op=op, name=step[1], rc=rc)
        else:
            emit(op=op, rc=-1, error="unknown step")
    out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
