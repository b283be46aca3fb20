"""Drives the simulated NCCL through ctypes from a JSON plan, for tests/c/rec_profiler.c to record.

Steps: ["init", NAME, NRANKS] | ["mask", HEX] (REC_PROF_MASK for the inits that follow) |
["ar", NAME, COUNT, STREAM or null] | ["begin", STREAM] | ["end", STREAM, GRAPH] | ["launch", GRAPH] |
["gdestroy", GRAPH] | ["sync"] | ["destroy", NAME] | ["fork", [STEPS]] (a child runs STEPS, then
_exit) | ["exit"] (a normal exit with whatever is still live). Prints "main_tid=N" and every step's
return code; a nonzero code ends the run with status 3.
"""
import ctypes
import json
import os
import sys
import threading


class UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * 128)]


def main():
    lib = ctypes.CDLL(os.path.join(sys.argv[1], "libnccl.so.2"))
    plan = json.loads(sys.argv[2])
    for name in ("ncclprobeSimStreamBeginCapture", "ncclprobeSimGraphLaunch", "ncclprobeSimGraphDestroy"):
        getattr(lib, name).argtypes = [ctypes.c_void_p]
    lib.ncclprobeSimStreamEndCapture.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p)]
    lib.ncclAllReduce.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                                  ctypes.c_void_p, ctypes.c_void_p]
    lib.ncclCommInitRank.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, UniqueId, ctypes.c_int]
    comms, graphs, streams = {}, {}, {}
    buf = ctypes.create_string_buffer(1 << 16)

    def stream(name):
        if name is None:
            return None
        if name not in streams:
            streams[name] = ctypes.create_string_buffer(1)
        return ctypes.cast(streams[name], ctypes.c_void_p)

    def run(steps):
        for step in steps:
            op = step[0]
            if op == "init":
                uid = UniqueId()
                lib.ncclGetUniqueId(ctypes.byref(uid))
                comms[step[1]] = ctypes.c_void_p()
                rc = lib.ncclCommInitRank(ctypes.byref(comms[step[1]]), step[2], uid, 0)
            elif op == "mask":
                os.environ["REC_PROF_MASK"] = step[1]
                rc = 0
            elif op == "ar":
                rc = lib.ncclAllReduce(buf, buf, step[2], 7, 0, comms[step[1]], stream(step[3]))
            elif op == "begin":
                rc = lib.ncclprobeSimStreamBeginCapture(stream(step[1]))
            elif op == "end":
                graphs[step[2]] = ctypes.c_void_p()
                rc = lib.ncclprobeSimStreamEndCapture(stream(step[1]), ctypes.byref(graphs[step[2]]))
            elif op == "launch":
                rc = lib.ncclprobeSimGraphLaunch(graphs[step[1]])
            elif op == "gdestroy":
                rc = lib.ncclprobeSimGraphDestroy(graphs[step[1]])
            elif op == "sync":
                rc = lib.ncclprobeSimSynchronize()
            elif op == "destroy":
                rc = lib.ncclCommDestroy(comms.pop(step[1]))
            elif op == "fork":
                sys.stdout.flush()
                pid = os.fork()
                if pid == 0:
                    run(step[1])
                    sys.stdout.flush()
                    os._exit(0)
                _, status = os.waitpid(pid, 0)
                rc = status
            elif op == "exit":
                sys.exit(0)
            print(f"{op} rc={rc}")
            if rc != 0:
                sys.exit(3)

    print(f"main_tid={threading.get_native_id()}")
    run(plan)


if __name__ == "__main__":
    main()
