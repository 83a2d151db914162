#!/usr/bin/env python3
"""The NetworkPolicy benchmark's driver (docs/bench/README.md, "NetworkPolicy enforcement");
tests/bench/netpol-bench.sh runs it as root inside a fresh network namespace, with the agent
binary, the API stand-in (install/node/tests/k8s_standin.py), its certificate and a kubeconfig.

For each scale it writes the cluster's objects, starts the stand-in, `nft monitor` and the agent
(`--datastore kubernetes`) in this namespace, then times events posted to the stand-in's control
port until `nft monitor` shows the kernel applying them. Every nf_tables transaction in this
namespace is the agent's: nothing else here commits one while an agent runs.

Prints two markdown tables (events; first sync) on stdout, progress on stderr.
"""
import argparse
import http.client
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

TABLE = "cni-rs-netpol"
NODE = "n0"
NODE_IP = "10.95.0.11"
CLUSTER_CIDR = "10.244.0.0/16"
NODES = 10
# How long an event may take to show before it counts as not applied.
TIMEOUT = 10.0
# Pause after an event is applied, before the next one is posted.
GAP = 0.02


def log(*a):
    print("netpol-bench:", *a, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# The cluster's objects

def node_cidr(k):
    """Node k's pod CIDR: 10.244.4k.0/22."""
    return "10.244.%d.0/22" % (4 * k)


def pod_ip(k, j):
    """The j-th address of node k's pod CIDR (j from 1)."""
    return "10.244.%d.%d" % (4 * k + j // 256, j % 256)


def namespace(name, labels):
    labels = dict(labels, **{"kubernetes.io/metadata.name": name})
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels},
            "spec": {"finalizers": ["kubernetes"]}, "status": {"phase": "Active"}}


def pod(ns, name, labels, node, ip, ports):
    containers = [{"name": "main", "image": "registry.k8s.io/e2e-test-images/agnhost:2.53",
                   "ports": [{"name": n, "containerPort": p, "protocol": proto} for n, p, proto in ports]}]
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": ns, "labels": labels},
            "spec": {"nodeName": "n%d" % node, "hostNetwork": False, "containers": containers},
            "status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}], "hostIP": "10.95.0.%d" % (11 + node)}}


def policy(ns, name, spec):
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": name, "namespace": ns}, "spec": spec}


def sel(**labels):
    return {"matchLabels": labels}


def expr(key, op, values=None):
    e = {"key": key, "operator": op}
    if values is not None:
        e["values"] = values
    return {"matchExpressions": [e]}


def tcp(port, end=None, proto="TCP"):
    p = {"protocol": proto, "port": port}
    if end is not None:
        p["endPort"] = end
    return p


# The event pods: namespace bench on this node, the labels and ports the bench policies pick.
EVENT_LABELS = {"app": "web", "role": "api"}
EVENT_PORTS = [("http", 8080, "TCP"), ("metrics", 9090, "TCP")]


def bench_policies():
    """The five policies of namespace bench, the same at both scales: every set an event pod
    belongs to comes from them, so an event pod's elements are the same at both scales."""
    return [
        policy("bench", "default-deny-ingress", {"podSelector": {}, "policyTypes": ["Ingress"]}),
        policy("bench", "web-from-frontend", {
            "podSelector": sel(app="web"), "policyTypes": ["Ingress"],
            "ingress": [{"from": [{"podSelector": sel(role="frontend")}], "ports": [tcp("http")]}]}),
        policy("bench", "metrics-from-monitoring", {
            "podSelector": {}, "policyTypes": ["Ingress"],
            "ingress": [{"from": [{"namespaceSelector": sel(team="monitoring"), "podSelector": sel(app="prometheus")}],
                         "ports": [tcp("metrics")]}]}),
        policy("bench", "web-egress", {
            "podSelector": sel(app="web"), "policyTypes": ["Egress"],
            "egress": [
                {"to": [{"namespaceSelector": sel(**{"kubernetes.io/metadata.name": "kube-system"}),
                         "podSelector": sel(**{"k8s-app": "kube-dns"})}],
                 "ports": [tcp(53, proto="UDP"), tcp(53)]},
                {"to": [{"ipBlock": {"cidr": "10.0.0.0/8", "except": ["10.244.0.0/16"]}}], "ports": [tcp(5432, 5440)]},
            ]}),
        policy("bench", "api-from-clients", {
            "podSelector": sel(role="api"), "policyTypes": ["Ingress"],
            "ingress": [{"from": [{"podSelector": sel(role="client")}], "ports": [tcp(80), tcp(443)]}]}),
    ]


def base_pods():
    """The ten pods of the small scale (also part of the large one): bench's, DNS, monitoring."""
    pods = []
    for j, role in enumerate(["frontend", "frontend", "client", "api", "api", "worker", "client"]):
        node = 0 if j % 2 == 0 else 1 + j % (NODES - 1)
        labels = {"app": "web" if role in ("api", "frontend") else "tool", "role": role}
        pods.append(pod("bench", "base-%d" % j, labels, node, pod_ip(node, 10 + j), EVENT_PORTS))
    for j in range(2):
        pods.append(pod("kube-system", "coredns-%d" % j, {"k8s-app": "kube-dns"}, 1 + j, pod_ip(1 + j, 5),
                        [("dns", 53, "UDP"), ("dns-tcp", 53, "TCP"), ("metrics", 9153, "TCP")]))
    pods.append(pod("monitoring", "prometheus-0", {"app": "prometheus"}, 3, pod_ip(3, 5), [("web", 9090, "TCP")]))
    return pods


def base_namespaces():
    return [namespace("bench", {"team": "bench"}), namespace("kube-system", {}),
            namespace("monitoring", {"team": "monitoring"})]


def other_policy(i):
    """Policy i of the 495 others, in namespace app-<i % 20>, of eight shapes."""
    ns = "app-%02d" % (i % 20)
    a, b = "svc-%d" % (i % 10), "svc-%d" % ((i + 3) % 10)
    shape = i % 8
    if shape == 0:
        spec = {"podSelector": sel(app=a), "policyTypes": ["Ingress"],
                "ingress": [{"from": [{"podSelector": sel(app=b, tier="frontend")}], "ports": [tcp(8080)]}]}
    elif shape == 1:
        spec = {"podSelector": sel(app=a), "policyTypes": ["Ingress"],
                "ingress": [{"from": [{"namespaceSelector": sel(team="t%d" % (i % 5))}], "ports": [tcp("http")]}]}
    elif shape == 2:
        spec = {"podSelector": expr("tier", "In", ["backend", "db"]), "policyTypes": ["Ingress"],
                "ingress": [{"from": [{"namespaceSelector": expr("env", "In", ["prod"]),
                                       "podSelector": expr("tier", "In", ["frontend", "backend"])}],
                             "ports": [tcp(9000, 9010 + i % 50)]}]}
    elif shape == 3:
        spec = {"podSelector": sel(app=a), "policyTypes": ["Ingress"],
                "ingress": [{"from": [{"ipBlock": {"cidr": "172.16.0.0/12", "except": ["172.16.%d.0/24" % (i % 256)]}},
                                      {"ipBlock": {"cidr": CLUSTER_CIDR, "except": ["10.244.%d.0/22" % (4 * (i % 10))]}}],
                             "ports": [tcp(53, proto="UDP"), tcp(8443)]}]}
    elif shape == 4:
        spec = {"podSelector": expr("app", "NotIn", [a]), "policyTypes": ["Egress"],
                "egress": [{"to": [{"podSelector": expr("tier", "Exists")}], "ports": [tcp(5432)]}]}
    elif shape == 5:
        spec = {"podSelector": sel(app=a), "policyTypes": ["Ingress", "Egress"],
                "ingress": [{"from": [{"podSelector": sel(tier="frontend")}], "ports": [tcp("metrics")]}],
                "egress": [{"to": [{"namespaceSelector": sel(**{"kubernetes.io/metadata.name": "kube-system"}),
                                    "podSelector": sel(**{"k8s-app": "kube-dns"})}],
                            "ports": [tcp(53, proto="UDP"), tcp(53)]},
                           {"to": [{"ipBlock": {"cidr": "0.0.0.0/0", "except": ["10.0.0.0/8", "192.168.0.0/16"]}}],
                            "ports": [tcp(443)]}]}
    elif shape == 6:
        spec = {"podSelector": sel(app=a), "policyTypes": ["Egress"],
                "egress": [{"to": [{"namespaceSelector": expr("team", "In", ["t1", "t3"]),
                                    "podSelector": sel(app=b)}], "ports": [tcp("grpc")]}]}
    else:
        spec = {"podSelector": sel(app=a, tier="backend"), "policyTypes": ["Ingress"],
                "ingress": [{"from": [{"podSelector": sel(app=b)}], "ports": [tcp(30000, 30100)]},
                            {"from": [{"namespaceSelector": sel(team="monitoring"), "podSelector": sel(app="prometheus")}],
                             "ports": [tcp("metrics")]},
                            {"ports": [tcp(3868, proto="SCTP")]}]}
    return policy(ns, "policy-%03d" % i, spec)


def objects(scale):
    """(objects, pods, policies) of a scale: small is the ten base pods and bench's five policies;
    large adds 990 pods in 20 namespaces across 10 nodes (~100 on this node) and 495 policies."""
    node = {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": NODE, "labels": {"kubernetes.io/hostname": NODE}},
            "spec": {"podCIDR": node_cidr(0), "podCIDRs": [node_cidr(0)]},
            "status": {"addresses": [{"type": "InternalIP", "address": NODE_IP}, {"type": "Hostname", "address": NODE}]}}
    out = [node] + base_namespaces()
    pods, policies = base_pods(), bench_policies()
    if scale == "large":
        for k in range(20):
            out.append(namespace("app-%02d" % k, {"team": "t%d" % (k % 5), "env": "prod" if k % 2 else "staging"}))
        used = {}
        for p in pods:
            n = int(p["spec"]["nodeName"][1:])
            used[n] = used.get(n, 0) + 1
        for i in range(1000 - len(pods)):
            n = i % NODES
            used[n] = used.get(n, 0) + 1
            ports = [("http", 80 if i % 3 else 8080, "TCP"), ("grpc", 9000 + i % 4, "TCP"), ("metrics", 9100, "TCP")]
            labels = {"app": "svc-%d" % (i % 10), "tier": ["frontend", "backend", "db"][i % 3],
                      "pod-template-hash": "%08x" % (i * 2654435761 % 2**32)}
            pods.append(pod("app-%02d" % (i % 20), "pod-%04d" % i, labels, n, pod_ip(n, 20 + used[n]), ports))
        policies += [other_policy(i) for i in range(500 - len(policies))]
    return out + pods + policies, pods, policies


# ---------------------------------------------------------------------------------------------
# The kernel, seen by `nft monitor`

class Txn:
    def __init__(self, start):
        self.start = start  # when its first line was read
        self.end = None  # when its "# new generation" line was read
        self.lines = []

    def count(self, verb):
        """Lines of this table's objects: count("add element") and so on."""
        return sum(1 for l in self.lines if l.startswith("%s inet %s " % (verb, TABLE)))

    def swap(self):
        return any(l.startswith("add table inet " + TABLE) for l in self.lines)


class Monitor:
    """`nft monitor` in this namespace; each line timestamped as it is read, grouped into
    transactions by the "# new generation" line nft prints after each."""

    def __init__(self, pids):
        self.proc = subprocess.Popen(["nft", "monitor"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, bufsize=1)
        pids.append(self.proc.pid)
        self.txns = []
        self.cond = threading.Condition()
        threading.Thread(target=self.read, daemon=True).start()
        time.sleep(0.3)  # nft subscribes before anything is measured

    def read(self):
        cur = None
        for line in self.proc.stdout:
            now = time.monotonic()
            line = line.rstrip("\n")
            if cur is None:
                cur = Txn(now)
            if line.startswith("# new generation"):
                cur.end = now
                with self.cond:
                    self.txns.append(cur)
                    self.cond.notify_all()
                cur = None
            else:
                cur.lines.append(line)

    def wait(self, since, match, timeout=TIMEOUT):
        """The first transaction from index `since` on for which match(txn) holds, or None."""
        deadline = time.monotonic() + timeout
        i = since
        with self.cond:
            while True:
                while i < len(self.txns):
                    if match(self.txns[i]):
                        return self.txns[i]
                    i += 1
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self.cond.wait(left)

    def mark(self):
        with self.cond:
            return len(self.txns)

    def between(self, t0, t1):
        with self.cond:
            return [t for t in self.txns if t0 <= t.start < t1]

    def stop(self):
        self.proc.kill()
        self.proc.wait()


def element_re(verb, ip):
    # One element a line: "add element inet T SET { 10.244.3.7 }" or "{ 10.244.3.7 . tcp . 8080 }".
    return re.compile(r"^%s element inet %s \S+ \{ %s[ }]" % (verb, TABLE, re.escape(ip)))


def has(pattern):
    return lambda txn: any(pattern.search(l) for l in txn.lines)


# ---------------------------------------------------------------------------------------------
# The agent and the stand-in

def cpu_seconds(pid):
    """(utime, stime) of the whole process (every thread), in seconds."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def post(path, body):
    """POSTs to the stand-in's control port; returns the time just before sending."""
    data = json.dumps(body).encode() if body is not None else b""
    conn = http.client.HTTPConnection("127.0.0.1", 6444, timeout=10)
    t0 = time.monotonic()
    conn.request("POST", path, body=data, headers={"Content-Length": str(len(data))})
    status = conn.getresponse().status
    conn.close()
    if status >= 300:
        raise RuntimeError("stand-in control %s: HTTP %d" % (path, status))
    return t0


def apply(obj):
    return post("/apply", obj)


def delete(kind, ns, name):
    return post("/delete?kind=%s&namespace=%s&name=%s" % (kind, ns, name), None)


def pct(values, p):
    """Nearest rank."""
    s = sorted(values)
    if not s:
        return float("nan")
    k = max(1, -(-len(s) * p // 100))
    return s[int(k) - 1]


def spread(values):
    """"7" when every value is 7, "6-8" otherwise, "-" for none."""
    if not values:
        return "-"
    lo, hi = min(values), max(values)
    return "%d" % lo if lo == hi else "%d-%d" % (lo, hi)


class Run:
    def __init__(self, args, scale):
        self.args, self.scale = args, scale
        self.work = os.path.join(args.work, scale)
        os.makedirs(self.work, exist_ok=True)
        self.pids = []
        self.rows = []
        self.marker = 0
        self.agent = self.standin = self.monitor = None

    def remember(self, pid):
        self.pids.append(pid)
        with open(self.args.pids, "a") as f:
            f.write("%d\n" % pid)

    def start(self):
        objs, pods, policies = objects(self.scale)
        self.npods, self.npolicies = len(pods), len(policies)
        path = os.path.join(self.work, "objects.json")
        with open(path, "w") as f:
            json.dump(objs, f)
        self.standin = subprocess.Popen(
            ["python3", self.args.standin, self.args.cert, self.args.key, self.args.token, NODE_IP + ":6443", "6444",
             path], stdout=subprocess.PIPE, stderr=open(os.path.join(self.work, "standin.log"), "w"), text=True)
        self.remember(self.standin.pid)
        if self.standin.stdout.readline().strip() != "serving":
            raise RuntimeError("the stand-in did not start; see %s/standin.log" % self.work)
        pids = []
        self.monitor = Monitor(pids)
        self.remember(pids[0])
        agent_args = [self.args.agent, "--node-name", NODE, "--datastore", "kubernetes", "--kubeconfig",
                      self.args.kubeconfig, "--cluster-cidr", CLUSTER_CIDR, "--node-ip", NODE_IP, "--backend",
                      "host-gw", "--no-plugins", "--conf-dir", os.path.join(self.work, "net.d"), "--bin-dir",
                      os.path.join(self.work, "bin"), "--state-dir", os.path.join(self.work, "state")]
        self.agent_log = os.path.join(self.work, "agent.log")
        t0 = time.monotonic()
        self.agent = subprocess.Popen(agent_args, stdout=open(self.agent_log, "w"), stderr=subprocess.STDOUT)
        self.remember(self.agent.pid)
        first = None
        for _ in range(120):
            first = self.monitor.wait(0, lambda t: t.swap(), timeout=0.5)
            if first is not None or self.agent.poll() is not None:
                break
        if first is None:
            raise RuntimeError("no table %s; agent log %s:\n%s" % (
                "after 60 s" if self.agent.poll() is None else "and the agent exited", self.agent_log, self.tail()))
        time.sleep(0.2)
        self.sync = {"ms": (first.start - t0) * 1e3, "cpu": sum(cpu_seconds(self.agent.pid)) * 1e3,
                     "sets": first.count("add set"), "rules": first.count("add rule"),
                     "elements": first.count("add element")}
        log("%s: first sync after %.0f ms: %d sets, %d rules, %d elements" % (
            self.scale, self.sync["ms"], self.sync["sets"], self.sync["rules"], self.sync["elements"]))

    def tail(self):
        with open(self.agent_log) as f:
            return "".join(f.readlines()[-20:])

    def stop(self):
        for p in (self.agent, self.standin):
            if p is not None and p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        if self.monitor is not None:
            self.monitor.stop()
        subprocess.run(["nft", "delete", "table", "inet", TABLE], stderr=subprocess.DEVNULL)

    def swap_now(self):
        """A policy change that changes the rules: the agent swaps the table, and its periodic
        swap (every 30 s) is then 30 s away, past the next phase."""
        self.marker += 1
        port = 40000 + self.marker
        p = policy("bench", "marker", {"podSelector": sel(role="none"), "policyTypes": ["Ingress"],
                                       "ingress": [{"ports": [tcp(port)]}]})
        since = self.monitor.mark()
        apply(p)
        if self.monitor.wait(since, lambda t: t.swap() and any("dport %d " % port in l for l in t.lines)) is None:
            raise RuntimeError("the marker policy was not applied; agent log:\n" + self.tail())
        time.sleep(0.1)

    def phase(self, name, events):
        """events: a list of (post: () -> time, match: txn -> bool). Posts each, waits for its
        transaction, records the latency and what the kernel changed in the event's window."""
        if name.startswith("pod"):
            self.swap_now()
        cpu0 = cpu_seconds(self.agent.pid)
        stamps, lat = [], []
        missed = 0
        for send, match in events:
            since = self.monitor.mark()
            t0 = send()
            txn = self.monitor.wait(since, match)
            stamps.append(t0)
            if txn is not None:
                lat.append((txn.start - t0) * 1e3)
                missed = 0
            else:
                missed += 1
                if missed == 3:
                    log("%s %s: three events in a row not applied; the rest of this phase is skipped" % (
                        self.scale, name))
                    break
            time.sleep(GAP)
        time.sleep(0.1)
        cpu1 = cpu_seconds(self.agent.pid)
        posted = len(stamps)
        stamps.append(time.monotonic())
        added, deleted, rules, swaps = [], [], [], 0
        for t0, t1 in zip(stamps, stamps[1:]):
            txns = self.monitor.between(t0, t1)
            if any(t.swap() for t in txns):
                swaps += 1
            added.append(sum(t.count("add element") for t in txns))
            deleted.append(sum(t.count("delete element") for t in txns))
            rules.append(sum(t.count("add rule") for t in txns))
        n = len(events)
        row = {"scale": self.scale, "pods": self.npods, "policies": self.npolicies, "event": name, "events": n,
               "applied": len(lat), "p50": pct(lat, 50), "p99": pct(lat, 99), "max": max(lat) if lat else float("nan"),
               "swaps": swaps, "added": spread(added), "deleted": spread(deleted), "rules": spread(rules),
               "user": (cpu1[0] - cpu0[0]) * 1e3 / posted, "sys": (cpu1[1] - cpu0[1]) * 1e3 / posted}
        log("%s %s: %d/%d applied, p50 %.1f ms, p99 %.1f ms, %d swaps, elements +%s -%s, %.2f + %.2f ms CPU/event" % (
            self.scale, name, row["applied"], n, row["p50"], row["p99"], swaps, row["added"], row["deleted"], row["user"],
            row["sys"]))
        self.rows.append(row)

    def measure(self, n_pods, n_policies):
        base = 512  # event pods take 10.244.2.0/23 of this node's /22
        ips = [pod_ip(0, base + i) for i in range(n_pods)]
        names = ["ev-%03d" % i for i in range(n_pods)]

        def pod_obj(i, labels):
            return pod("bench", names[i], labels, 0, ips[i], EVENT_PORTS)

        def ev(send, match):
            return (send, match)

        self.phase("pod add", [ev(lambda i=i: apply(pod_obj(i, EVENT_LABELS)), has(element_re("add", ips[i])))
                               for i in range(n_pods)])
        relabelled = dict(EVENT_LABELS, role="frontend")
        self.phase("pod relabel", [ev(lambda i=i: apply(pod_obj(i, relabelled)),
                                      has(re.compile(r"^(add|delete) element inet %s \S+ \{ %s[ }]" % (TABLE, re.escape(ips[i])))))
                                   for i in range(n_pods)])
        def gone(ip):
            # Its element deleted, or a table swap without its address (which the table swaps
            # column then shows).
            deleted, present = element_re("delete", ip), re.compile(r"\{ %s[ }]" % re.escape(ip))
            return lambda t: has(deleted)(t) or (t.swap() and not has(present)(t))

        self.phase("pod delete", [ev(lambda i=i: delete("Pod", "bench", names[i]), gone(ips[i])) for i in range(n_pods)])

        def pol(i, port):
            return policy("bench", "ev-%03d" % i, {
                "podSelector": sel(role="api"), "policyTypes": ["Ingress"],
                "ingress": [{"from": [{"podSelector": sel(role="client")}], "ports": [tcp(port)]}]})

        def rule_with(name, port):
            pattern = re.compile(r'^add rule inet %s .*dport %d .*comment "bench/%s ' % (TABLE, port, name))
            return lambda t: t.swap() and has(pattern)(t)

        def without(name):
            return lambda t: t.swap() and not any('comment "bench/%s ' % name in l for l in t.lines)

        self.phase("policy add", [ev(lambda i=i: apply(pol(i, 10000 + i)), rule_with("ev-%03d" % i, 10000 + i))
                                  for i in range(n_policies)])
        self.phase("policy update", [ev(lambda i=i: apply(pol(i, 20000 + i)), rule_with("ev-%03d" % i, 20000 + i))
                                     for i in range(n_policies)])
        self.phase("policy delete", [ev(lambda i=i: delete("NetworkPolicy", "bench", "ev-%03d" % i),
                                        without("ev-%03d" % i)) for i in range(n_policies)])


def main():
    ap = argparse.ArgumentParser()
    for name in ("agent", "standin", "cert", "key", "token", "kubeconfig", "work", "pids"):
        ap.add_argument("--" + name, required=True)
    ap.add_argument("--pod-events", type=int, default=200)
    ap.add_argument("--policy-events", type=int, default=100)
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    rows, syncs = [], []
    for scale in ("small", "large"):
        run = Run(args, scale)
        try:
            run.start()
            run.measure(args.pod_events, args.policy_events)
        finally:
            run.stop()
        rows += run.rows
        syncs.append((scale, run.npods, run.npolicies, run.sync))
    print("| scale | event | applied | p50, ms | p99, ms | max, ms | events with a table swap "
          "| elements added / event | elements deleted / event | rules added / event | agent CPU, ms / event (user + sys) |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print("| %s (%d pods, %d policies) | %s | %d/%d | %.1f | %.1f | %.1f | %d | %s | %s | %s | %.2f (%.2f + %.2f) |" % (
            r["scale"], r["pods"], r["policies"], r["event"], r["applied"], r["events"], r["p50"], r["p99"], r["max"],
            r["swaps"], r["added"], r["deleted"], r["rules"], r["user"] + r["sys"], r["user"], r["sys"]))
    print()
    print("| first sync | pods | policies | agent start to table, ms | agent CPU, ms | sets | rules | elements |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for scale, pods, policies, s in syncs:
        print("| %s | %d | %d | %.0f | %.0f | %d | %d | %d |" % (
            scale, pods, policies, s["ms"], s["cpu"], s["sets"], s["rules"], s["elements"]))


if __name__ == "__main__":
    main()
