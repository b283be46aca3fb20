"""inspect's process tree as a document: each process with its exec-time environment (diffed against its
parent's), its live one where --live read it, its libnccl copies, GPUs and nccl.conf files."""
from __future__ import annotations

from ncclprobe.doc import Text, Title, Tree
from ncclprobe.model import wiring
from ncclprobe.witnesses import conffiles, procs, procsnap


def lib_label(lib: dict) -> str:
    """`libnccl 2.28.9 (simulated NCCL) PATH`: a simulated copy is named so wherever it is shown."""
    return (f"libnccl {lib['version'] or '?'}" + (" (simulated NCCL)" if lib.get("simulated") else "")
            + f" {lib['path']}")


def document(recs: list[dict], tree: procs.ProcTree, notes: list[str], gpu_reason: str,
              not_found: list[dict] = (), show_wiring: bool = False, live: dict | None = None) -> list:
    by_pid = {r["pid"]: r for r in recs}
    kids: dict[int, list[int]] = {}
    for r in recs:
        kids.setdefault(r["ppid"], []).append(r["pid"])
    doc: list = [Title(f"Process tree under {', '.join(str(r) for r in tree.roots)} "
                       f"({len(recs)} process{'es' if len(recs) != 1 else ''}, exec-time view from /proc"
                       + (", live environment from memory" if live is not None else "") + ")")]
    drawn: set[int] = set()

    def node(pid: int) -> Tree:
        drawn.add(pid)
        r = by_pid[pid]
        label = f"{pid} {r['command']}  [{r['user'] or '?'}, {r['state']}, started {r['start_time'] or '?'}]"
        t = Tree(label, style="" if r["in_scope"] else "dim")
        t.children.append(_env_node(r, by_pid.get(r["ppid"]), show_wiring))
        if live is not None:
            t.children.append(_live_node(r, show_wiring))
        for lib in r["nccl_libs"]:
            t.children.append(Tree(f"{lib_label(lib)} — {lib['reached_by']}",
                                   style="warn" if lib["kind"] == "static" else ""))
        if r["gpus"] or r["cuda_visible_devices"] is not None:
            g = ",".join(map(str, r["gpus"])) or "none"
            cvd = r["cuda_visible_devices"]
            t.children.append(Tree(f"GPUs: {g} ({r['gpus_source'] or r['gpus_reason']})"
                                   + (f"  CUDA_VISIBLE_DEVICES={cvd}" if cvd is not None else "")))
        for conf in r["conf_files"] or []:
            t.children.append(Tree(conffiles.describe(conf), style="note"))
        for child in sorted(kids.get(pid, [])):
            if child not in drawn:
                t.children.append(node(child))
        return t

    for root in tree.roots:
        if root not in drawn:
            doc.append(node(root))
    for n in notes:
        doc.append(Text(n, "note"))
    if gpu_reason:
        doc.append(Text(f"GPUs from open /dev/nvidia* files: {gpu_reason}", "dim"))
    for s in not_found:
        doc.append(Text(f"pid {s['pid']} (given) not examined: {s['reason'].replace('_', ' ')} (exit code 3)", "warn"))
    for s in tree.skipped:
        doc.append(Text(f"pid {s['pid']} skipped: {s['reason']} (exited mid-walk or refused)", "dim"))
    if live is not None:
        scope = live["ptrace_scope"]
        doc.append(Text(f"live: {live['read']} of {len(recs)} read from memory ({live['bytes_read']} bytes, "
                        f"{live['retries']} torn read(s) retried); Yama ptrace_scope "
                        + (str(scope) if scope is not None else "absent (no Yama on this kernel)"), "dim"))
    if tree.excluded:
        doc.append(Text(f"left out: this ncclprobe process ({', '.join(map(str, tree.excluded))}) and anything "
                        "under it", "dim"))
    return doc


def _env_node(r: dict, parent: dict | None, show_wiring: bool = False) -> Tree:
    src, why = r["env_source"], r["env_reason"]
    if src == "unreadable":
        return Tree(f"env: unreadable ({why})", style="warn")
    if src == "empty":
        return Tree(f"env: empty ({why})", style="warn")
    env, wired = (r["env"] or {}, {}) if show_wiring else wiring.split(r["env"] or {})
    if parent is not None and parent.get("env") is not None and not show_wiring:
        parent = {**parent, "env": wiring.job_env(parent["env"])}
    stale = {"fork": "fork child: shows its parent's exec-time block",
             "forkserver": "forkserver child: shows the server's block from its start",
             "clobbered": "block partly overwritten"}.get(r["stale"] or "")
    head = f"env: exec, {len(env)} shown" + (f" (+{len(wired)} of ncclprobe's wiring: --show-wiring)" if wired else "") \
        + (f" — {stale}" if stale else "")
    if why == "empty at exec":
        head = "env: exec, empty at exec (started with no environment at all)" + (f" — {stale}" if stale else "")
    t = Tree(head, style="warn" if stale else "")
    diff = r["env_diff"] if show_wiring or parent is None else procsnap.env_diff({"env": env}, parent)
    if diff is None or parent is None:
        t.children.extend(Tree(f"{k}={v}") for k, v in sorted(env.items()))
        return t
    if diff["inherited"]:
        t.children.append(Tree(f"{len(diff['inherited'])} inherited unchanged from {parent['pid']}", style="dim"))
    t.children.extend(Tree(f"+ {k}={v}", style="good") for k, v in diff["added"].items())
    t.children.extend(Tree(f"- {k} (parent: {parent['env'][k]})", style="warn") for k in diff["removed"])
    t.children.extend(Tree(f"~ {k}: {c['parent']} -> {c['value']}", style="warn") for k, c in diff["changed"].items())
    return t


def _live_node(r: dict, show_wiring: bool = False) -> Tree:
    """The environment the process holds now, as what changed since exec: set, changed, unset in-process."""
    if r["live_env"] is None:
        return Tree(f"live: not read ({r['live_reason']})", style="warn")
    diff = r["live_diff"]
    if diff is None:  # no exec-time block to compare with
        env = r["live_env"] if show_wiring else wiring.job_env(r["live_env"]) or {}
        t = Tree(f"live (read from memory): {len(env)} shown")
        t.children.extend(Tree(f"{k}={v}") for k, v in sorted(env.items()))
        return t
    ours = set() if show_wiring else set(r["live_env"]) - set(wiring.job_env(r["live_env"]) or {})
    lines = [Tree(f"+ {k}={v}  (set in-process" + (f"; NCCL's conf file {diff['conf'][k]}" if k in diff["conf"] else "")
                  + ")", style="good") for k, v in diff["set"].items() if k not in ours]
    lines += [Tree(f"~ {k}: {c['exec']} -> {c['live']}  (changed in-process)", style="warn")
              for k, c in diff["changed"].items() if k not in ours]
    lines += [Tree(f"- {k}  (unset in-process)", style="warn") for k in diff["unset"] if k not in ours]
    if not lines:
        return Tree("live (read from memory): as at exec", style="dim")
    t = Tree(f"live (read from memory): {len(lines)} differ{'s' if len(lines) == 1 else ''} from the exec-time block")
    t.children.extend(lines)
    return t
