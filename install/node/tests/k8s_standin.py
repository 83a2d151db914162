#!/usr/bin/env python3
"""A stand-in for the Kubernetes API server, for the agent's tests (tests/kubernetes.rs,
tests/network_policy.rs): the resources the agent reads, served as the API server serves them.

HTTPS with a bearer token. For each resource (Nodes, Namespaces, Pods, NetworkPolicies), the
cluster-wide path and, for namespaced ones, /namespaces/NS/ paths:
  GET .../pods                     a PodList with the current resourceVersion (limit is accepted;
                                   every item fits one page, so no continue token)
  GET .../pods?watch=true&resourceVersion=N
                                   a chunked stream of the events after N, written as they happen;
                                   410 Gone (an ERROR event) when N is older than the kind's
                                   compacted history; BOOKMARK events about every second when
                                   allowWatchBookmarks=true; ends after timeoutSeconds. Without a
                                   resourceVersion (or 0) the current objects come first as ADDED.
  PATCH /api/v1/nodes/NAME         a merge patch of the Node's annotations
labelSelector and fieldSelector of the equality form (k=v, k!=v, comma-separated) filter both.
resourceVersions are one counter across kinds, as etcd's revision is.

A plain-HTTP control port on 127.0.0.1 lets the test change the objects (the body is an object or
a list of objects, each with its kind; Node when a body has none):
  POST /apply                      ADDED when new, MODIFIED otherwise
  POST /add, /modify               ADDED / MODIFIED
  POST /delete?name=N[&kind=K][&namespace=NS]   DELETED (kind defaults to Node)
  POST /gone[?kind=K]              objects applied without any event; the kind's history is
                                   compacted, so its open watches end with 410 Gone and only a
                                   new list shows them (kind defaults to Node)
  GET /log                         the requests seen: LIST nodes, WATCH nodes 5, PATCH n0, ...

usage: k8s_standin.py CERT KEY TOKEN [ADDRESS:]API_PORT CONTROL_PORT OBJECTS_JSON
"""
import json
import socket
import ssl
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

CERT, KEY, TOKEN, API, CONTROL_PORT, OBJECTS = sys.argv[1:7]
BOOKMARK_EVERY = 1.0

# plural -> (kind, apiVersion, namespaced, API group prefix)
RESOURCES = {
    "nodes": ("Node", "v1", False, "/api/v1/"),
    "namespaces": ("Namespace", "v1", False, "/api/v1/"),
    "pods": ("Pod", "v1", True, "/api/v1/"),
    "networkpolicies": ("NetworkPolicy", "networking.k8s.io/v1", True, "/apis/networking.k8s.io/v1/"),
}
PLURAL = {kind: plural for plural, (kind, _, _, _) in RESOURCES.items()}

lock = threading.Condition()
state = {
    "rv": 1,
    "objects": {plural: {} for plural in RESOURCES},
    "history": [],  # (rv, plural, event type, object), rv ascending
    "compacted": {plural: 0 for plural in RESOURCES},  # a watch from before this gets 410
    "epoch": {plural: 0 for plural in RESOURCES},  # bumped by /gone: open watches end with 410
    "log": [],
}


def key(obj):
    meta = obj.get("metadata", {})
    return (meta.get("namespace", ""), meta["name"])


def store(obj):
    """Stamps kind, apiVersion and the next resourceVersion on obj; returns its plural."""
    kind = obj.setdefault("kind", "Node")
    plural = PLURAL[kind]
    obj.setdefault("apiVersion", RESOURCES[plural][1])
    state["rv"] += 1
    meta = obj.setdefault("metadata", {})
    meta["resourceVersion"] = str(state["rv"])
    meta.setdefault("uid", "%08x-0000-4000-8000-%012d" % (abs(hash(kind + meta["name"])) % 2**32, state["rv"]))
    meta.setdefault("creationTimestamp", "2026-11-01T10:00:00Z")
    if RESOURCES[plural][2]:
        meta.setdefault("namespace", "default")
    return plural


def event(plural, kind, obj):
    state["history"].append((state["rv"], plural, kind, json.loads(json.dumps(obj))))
    lock.notify_all()


def apply(obj, kind=None):
    plural = store(obj)
    objects = state["objects"][plural]
    if kind is None:
        kind = "MODIFIED" if key(obj) in objects else "ADDED"
    objects[key(obj)] = obj
    event(plural, kind, obj)


def as_list(body):
    data = json.loads(body or b"[]")
    return data if isinstance(data, list) else [data]


for item in as_list(open(OBJECTS, "rb").read()):
    plural = store(item)
    state["objects"][plural][key(item)] = item


def route(path):
    """(plural, namespace or None, name or None) of an API path, or None."""
    for prefix in sorted({r[3] for r in RESOURCES.values()}):
        if not path.startswith(prefix):
            continue
        parts = path[len(prefix):].strip("/").split("/")
        here = {p for p, r in RESOURCES.items() if r[3] == prefix}
        if parts[0] == "namespaces" and len(parts) >= 3:
            if parts[2] in here and RESOURCES[parts[2]][2]:
                return parts[2], parts[1], (parts[3] if len(parts) > 3 else None)
            return None
        if parts[0] in here:
            return parts[0], None, (parts[1] if len(parts) > 1 else None)
    return None


def field(obj, path):
    for part in path.split("."):
        obj = obj.get(part) if isinstance(obj, dict) else None
    return "" if obj is None else str(obj)


def selected(obj, namespace, labels, fields):
    if namespace is not None and obj["metadata"].get("namespace") != namespace:
        return False
    have = obj["metadata"].get("labels") or {}
    for term in filter(None, labels.split(",")):
        if "!=" in term:
            k, v = term.split("!=", 1)
            if have.get(k) == v:
                return False
        elif "=" in term:
            k, v = term.split("=", 1)
            if have.get(k.rstrip("=")) != v:
                return False
        elif term.startswith("!"):
            if term[1:] in have:
                return False
        elif term not in have:
            return False
    for term in filter(None, fields.split(",")):
        if "!=" in term:
            k, v = term.split("!=", 1)
            if field(obj, k) == v:
                return False
        else:
            k, v = term.split("=", 1)
            if field(obj, k.rstrip("=")) != v:
                return False
    return True


class Api(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def setup(self):
        super().setup()
        # Watch events are small writes that must leave at once, not wait for an ACK (Nagle).
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, *args):
        pass

    def reply(self, code, body):
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def status(self, code, reason, message):
        self.reply(code, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                          "message": message, "reason": reason, "code": code})

    def authorized(self, what):
        ok = self.headers.get("Authorization") == "Bearer " + TOKEN
        with lock:
            state["log"].append(what if ok else "401 " + what)
        if not ok:
            self.status(401, "Unauthorized", "Unauthorized")
        return ok

    def chunks(self, objs):
        data = b"".join((json.dumps(o) + "\n").encode() for o in objs)
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def do_GET(self):
        url = urlparse(self.path)
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        found = route(url.path)
        if found is None or found[2] is not None:
            return self.status(404, "NotFound", "not served by the stand-in: " + url.path)
        plural, namespace, _ = found
        kind, api_version = RESOURCES[plural][:2]
        labels, fields = query.get("labelSelector", ""), query.get("fieldSelector", "")
        if query.get("watch", "0") not in ("1", "true"):
            if not self.authorized("LIST " + plural):
                return
            with lock:
                items = [o for o in state["objects"][plural].values() if selected(o, namespace, labels, fields)]
                body = {"kind": kind + "List", "apiVersion": api_version,
                        "metadata": {"resourceVersion": str(state["rv"])}, "items": items}
            return self.reply(200, body)
        since = int(query.get("resourceVersion", "0") or 0)
        if not self.authorized("WATCH %s %d" % (plural, since)):
            return
        timeout = float(query.get("timeoutSeconds", "0") or 0) or 1800.0
        deadline = time.monotonic() + timeout
        bookmarks = query.get("allowWatchBookmarks") in ("1", "true")
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            self.stream(plural, kind, api_version, since, namespace, labels, fields, deadline, bookmarks)
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError, ssl.SSLError, OSError):
            pass
        self.close_connection = True

    def stream(self, plural, kind, api_version, since, namespace, labels, fields, deadline, bookmarks):
        def gone(at):
            return {"type": "ERROR", "object": {
                "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": "too old resource version: %d (%d)" % (at, state["compacted"][plural]),
                "reason": "Expired", "code": 410}}

        with lock:
            epoch = state["epoch"][plural]
            if since == 0:
                out = [{"type": "ADDED", "object": o} for o in state["objects"][plural].values()
                       if selected(o, namespace, labels, fields)]
                sent = state["rv"]
            elif since < state["compacted"][plural]:
                out, sent = [gone(since)], None
            else:
                out, sent = [], since
        if out:
            self.chunks(out)
        if sent is None:
            return
        last_write = time.monotonic()
        while True:
            with lock:
                while True:
                    if state["epoch"][plural] != epoch:
                        out, sent = [gone(sent)], None
                        break
                    pending = []
                    for rv, p, typ, obj in reversed(state["history"]):
                        if rv <= sent:
                            break
                        if p == plural:
                            pending.append((rv, typ, obj))
                    now = time.monotonic()
                    if pending:
                        pending.reverse()
                        out = [{"type": t, "object": o} for (_, t, o) in pending
                               if selected(o, namespace, labels, fields)]
                        sent = pending[-1][0]
                        if out:
                            break
                        continue
                    if now >= deadline:
                        return
                    if bookmarks and now - last_write >= BOOKMARK_EVERY:
                        sent = state["rv"]
                        out = [{"type": "BOOKMARK", "object": {
                            "kind": kind, "apiVersion": api_version,
                            "metadata": {"resourceVersion": str(sent)}}}]
                        break
                    wait = deadline - now
                    if bookmarks:
                        wait = min(wait, BOOKMARK_EVERY - (now - last_write))
                    lock.wait(timeout=max(wait, 0.001))
            self.chunks(out)
            last_write = time.monotonic()
            if sent is None:
                return

    def do_PATCH(self):
        found = route(urlparse(self.path).path)
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        if found is None or found[0] != "nodes" or found[2] is None:
            return self.status(405, "MethodNotAllowed", "the stand-in patches only Nodes: " + self.path)
        name = found[2]
        if not self.authorized("PATCH " + name):
            return
        with lock:
            node = state["objects"]["nodes"].get(("", name))
            if node is None:
                return self.status(404, "NotFound", "nodes %r not found" % name)
            notes = node["metadata"].setdefault("annotations", {})
            for k, v in body.get("metadata", {}).get("annotations", {}).items():
                if v is None:
                    notes.pop(k, None)
                else:
                    notes[k] = v
            apply(node, "MODIFIED")
            self.reply(200, node)


class Control(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_GET(self):
        with lock:
            data = ("\n".join(state["log"]) + "\n").encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self):
        url = urlparse(self.path)
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        code = 204
        with lock:
            try:
                if url.path in ("/apply", "/add", "/modify"):
                    typ = {"/apply": None, "/add": "ADDED", "/modify": "MODIFIED"}[url.path]
                    for obj in as_list(body):
                        apply(obj, typ)
                elif url.path == "/delete":
                    plural = PLURAL[query.get("kind", "Node")]
                    obj = state["objects"][plural].pop((query.get("namespace", ""), query["name"]))
                    store(obj)
                    event(plural, "DELETED", obj)
                elif url.path == "/gone":
                    plural = PLURAL[query.get("kind", "Node")]
                    for obj in as_list(body):
                        p = store(obj)
                        state["objects"][p][key(obj)] = obj
                    state["compacted"][plural] = state["rv"]
                    state["epoch"][plural] += 1
                    lock.notify_all()
                else:
                    code = 404
            except (KeyError, ValueError) as e:
                code = 400
                sys.stderr.write("control %s: %r\n" % (self.path, e))
        self.send_response(code)
        self.send_header("Content-Length", "0")
        self.end_headers()


class Server(ThreadingHTTPServer):
    daemon_threads = True


host, _, port = API.rpartition(":")
api = Server((host or "127.0.0.1", int(port)), Api)
context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
context.load_cert_chain(CERT, KEY)
api.socket = context.wrap_socket(api.socket, server_side=True)
control = Server(("127.0.0.1", int(CONTROL_PORT)), Control)
threading.Thread(target=control.serve_forever, daemon=True).start()
print("serving", flush=True)
api.serve_forever()
