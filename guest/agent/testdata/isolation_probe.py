# A hostile spawn: tries to reach the agent, another session and another
# spawn, and uses its own session; prints one line "PROBE <json>" saying
# what each attempt gave ("ok", or the errno's name). Run by
# TestChildAgentIsolatesSessions (guest/agent) and TestSpawnIsolation /
# TestKVMSpawnIsolation (e2e) as `python3 -c <this> <json args>`.
import ctypes, errno, json, os, pwd, subprocess, sys

args = json.loads(sys.argv[1])
own, other, victim = args["own"], args["other"], args.get("victimPid", 0)
libc = ctypes.CDLL(None, use_errno=True)
libc.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_char_p]
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
libc.ptrace.restype = ctypes.c_long
out = {}


def name(e):
    return errno.errorcode.get(e, str(e))


def attempt(key, fn):
    try:
        fn()
        out[key] = "ok"
    except OSError as e:
        out[key] = name(e.errno)
    except Exception as e:  # noqa: BLE001 - report, never crash
        out[key] = "error: %r" % (e,)


def ptrace_attach(pid):
    def f():
        if libc.ptrace(16, pid, None, None) != 0:  # PTRACE_ATTACH
            e = ctypes.get_errno()
            raise OSError(e, os.strerror(e))
        libc.ptrace(17, pid, None, None)  # PTRACE_DETACH
    return f


def read(path, n=64):
    def f():
        with open(path, "rb") as fh:
            fh.read(n)
    return f


def mount9p(aname, target="/tmp/m9p"):
    os.makedirs(target, exist_ok=True)
    opts = "trans=virtio,version=9p2000.L"
    if aname:
        opts += ",aname=" + aname
    if libc.mount(b"cowork", target.encode(), b"9p", 0, opts.encode()) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
    libc.umount2(target.encode(), 2)


def mountvirtiofs(tag, target="/tmp/mvfs"):
    os.makedirs(target, exist_ok=True)
    if libc.mount(tag.encode(), target.encode(), b"virtiofs", 0, None) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
    libc.umount2(target.encode(), 2)


def write(path, data):
    def f():
        with open(path, "w") as fh:
            fh.write(data)
    return f


# (1) The agent, PID 1.
attempt("agentPtrace", ptrace_attach(1))
attempt("agentMem", read("/proc/1/mem"))
attempt("agentEnviron", read("/proc/1/environ"))
attempt("agentFdList", lambda: os.listdir("/proc/1/fd"))


def open_agent_fds():
    try:
        fds = [int(n) for n in os.listdir("/proc/1/fd")]
    except OSError:
        fds = range(64)
    last = OSError(errno.ENOENT, "no descriptor")
    for fd in fds:
        try:
            os.close(os.open("/proc/1/fd/%d" % fd, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY))
            return
        except OSError as e:
            if e.errno != errno.ENOENT:
                last = e
    raise last


# Reopening the agent's descriptors (its 9p roots, in the process backend
# the host root).
attempt("agentFd", open_agent_fds)
attempt("agentRoot", lambda: os.listdir("/proc/1/root/"))
# (2) The other session.
out["sessions"] = sorted(os.listdir("/sessions"))
attempt("otherSession", lambda: os.listdir("/sessions/" + other))
attempt("otherFile", read("/sessions/%s/%s" % (other, args.get("otherFile", "x"))))
# (3) The other spawn (its environment is where a token would be).
if victim:
    attempt("victimPtrace", ptrace_attach(victim))
    attempt("victimEnviron", read("/proc/%d/environ" % victim))
    attempt("victimRoot", lambda: os.listdir("/proc/%d/root/sessions/%s" % (victim, other)))
    attempt("victimSignal", lambda: os.kill(victim, 0))
out["envKeys"] = sorted(os.environ)
# (4) Mounting a session's 9p export or a virtio-fs device (every
# session's exports) itself, directly and from a user namespace of its own
# (which must still work: bubblewrap needs it).
codes = set()
for aname in [""] + ["e%d" % i for i in range(1, 13)] + [other]:
    try:
        mount9p(aname)
        codes.add("ok")
    except OSError as e:
        codes.add(name(e.errno))
out["mount9p"] = sorted(codes)
codes = set()
for tag in ["cowork", "cowork-sys"]:
    try:
        mountvirtiofs(tag)
        codes.add("ok")
    except OSError as e:
        codes.add(name(e.errno))
out["mountVirtioFS"] = sorted(codes)
uid, gid = os.getuid(), os.getgid()
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    res = {}
    try:
        if libc.unshare(0x10000000 | 0x00020000) != 0:  # CLONE_NEWUSER|CLONE_NEWNS
            raise OSError(ctypes.get_errno(), "unshare")
        open("/proc/self/setgroups", "w").write("deny")
        open("/proc/self/uid_map", "w").write("0 %d 1" % uid)
        open("/proc/self/gid_map", "w").write("0 %d 1" % gid)
        res["nestedUserns"] = "ok"
        try:
            os.makedirs("/tmp/nested", exist_ok=True)
            if libc.mount(b"none", b"/tmp/nested", b"tmpfs", 0, b"") != 0:
                raise OSError(ctypes.get_errno(), "mount tmpfs")
            res["nestedTmpfs"] = "ok"
        except OSError as e:
            res["nestedTmpfs"] = name(e.errno)
        try:
            mount9p(other)
            res["nestedMount9p"] = "ok"
        except OSError as e:
            res["nestedMount9p"] = name(e.errno)
        try:
            mountvirtiofs("cowork")
            res["nestedMountVirtioFS"] = "ok"
        except OSError as e:
            res["nestedMountVirtioFS"] = name(e.errno)
    except OSError as e:
        res["nestedUserns"] = name(e.errno)
    os.write(w, json.dumps(res).encode())
    os._exit(0)
os.close(w)
os.waitpid(pid, 0)
out.update(json.loads(os.read(r, 4096) or b"{}"))
# Its own session still works.
out["uid"] = uid
try:
    out["user"] = pwd.getpwuid(uid).pw_name
except KeyError:
    out["user"] = ""
attempt("ownWrite", write("/sessions/%s/probe.txt" % own, "probe\n"))
attempt("ownRead", read("/sessions/%s/probe.txt" % own))
attempt("ownChmod", lambda: os.chmod("/sessions/%s/probe.txt" % own, 0o755))
attempt("stdout", write("/dev/stdout", ""))
if args.get("rw"):
    attempt("rwWrite", write(args["rw"] + "/from-probe.txt", "probe\n"))
if args.get("ro"):
    attempt("roWrite", write(args["ro"] + "/from-probe.txt", "probe\n"))
if args.get("url"):
    try:
        res = subprocess.run(["curl", "-sS", "--max-time", "30", args["url"]], capture_output=True, text=True, timeout=60)
        out["curl"] = res.stdout.strip() or res.stderr.strip()
    except Exception as e:  # noqa: BLE001
        out["curl"] = "error: %r" % (e,)
print("PROBE " + json.dumps(out, sort_keys=True), flush=True)
