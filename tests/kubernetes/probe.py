"""The containment probe both real-execution layers hand to the in-Pod supervisor (podman, a real cluster):
it reports what the program sees from inside, as one JSON object on stdout. It sends nothing anywhere except,
when asked (``APP_PROBE_DNS=1``), one connection attempt to the Pod's own name server, which the deny-all
NetworkPolicy must block."""

PROBE = r"""
import json, os, socket
def read(path):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError as exc:
        return "error:%d" % exc.errno
status = dict(line.split(":\t", 1) for line in read("/proc/self/status").splitlines() if ":\t" in line)
def writable(path):
    try:
        with open(path, "w") as f:
            f.write("x")
        os.unlink(path)
        return True
    except OSError as exc:
        return exc.errno
mounts = {}
for line in read("/proc/self/mounts").splitlines():
    parts = line.split()
    mounts[parts[1]] = (parts[2], parts[3])
def size(path):
    st = os.statvfs(path)
    return st.f_blocks * st.f_frsize
cpu = read("/sys/fs/cgroup/cpu.max").split() if os.path.exists("/sys/fs/cgroup/cpu.max") else [
    read("/sys/fs/cgroup/cpu/cpu.cfs_quota_us"), read("/sys/fs/cgroup/cpu/cpu.cfs_period_us")]
memory = read("/sys/fs/cgroup/memory.max") if os.path.exists("/sys/fs/cgroup/memory.max") else read(
    "/sys/fs/cgroup/memory/memory.limit_in_bytes")
pids = read("/sys/fs/cgroup/pids.max") if os.path.exists("/sys/fs/cgroup/pids.max") else read(
    "/sys/fs/cgroup/pids/pids.max")
routes = [l for l in read("/proc/net/route").splitlines()[1:] if l.strip()]
dns = None
if os.environ.get("APP_PROBE_DNS") == "1":
    servers = [l.split()[1] for l in read("/etc/resolv.conf").splitlines() if l.startswith("nameserver ")]
    if servers:
        s = socket.socket()
        s.settimeout(3)
        try:
            s.connect((servers[0], 53))
            dns = "connected"
        except OSError as exc:
            dns = "refused:%s" % (exc.errno,)
        finally:
            s.close()
print(json.dumps({
    "dns": dns,
    "uid": os.getuid(), "gid": os.getgid(), "euid": os.geteuid(), "groups": os.getgroups(),
    "cap_eff": status["CapEff"].strip(), "cap_bnd": status["CapBnd"].strip(), "cap_prm": status["CapPrm"].strip(),
    "no_new_privs": status["NoNewPrivs"].strip(), "seccomp": status["Seccomp"].strip(),
    "root_writable": writable("/probe"), "usr_writable": writable("/usr/probe"),
    "tmp_writable": writable("/tmp/probe"), "workspace_writable": writable("/workspace/probe"),
    "root_mount": mounts.get("/"), "tmp_mount": mounts.get("/tmp"), "tmp_size": size("/tmp"),
    "interfaces": [name for _, name in socket.if_nameindex()], "routes": routes,
    "memory": memory, "cpu": cpu, "pids": pids, "hostname": socket.gethostname(),
    "sa_token": os.path.exists("/var/run/secrets/kubernetes.io/serviceaccount/token"),
    "pid1": read("/proc/1/cmdline").replace("\x00", " ")[:200],
    "env_keys": sorted(k for k in os.environ if k.startswith(("KUBERNETES", "GATEWAY"))),
}))
"""
