#!/usr/bin/env python3
"""A stand-in for the Kubernetes API server's Node endpoints, for tests/kubernetes.rs.

HTTPS with a bearer token as the API server serves them: GET /api/v1/nodes (a NodeList with a
resourceVersion), GET /api/v1/nodes?watch=1&resourceVersion=N (a chunked stream of watch events
after N), PATCH /api/v1/nodes/NAME (a merge patch of metadata). A plain-HTTP control port on
127.0.0.1 lets the test change the nodes: POST /add, /modify (a Node as body: ADDED / MODIFIED
event), /delete?name=N (DELETED event), /gone (body: Nodes applied without any event; the current
and next watch get a 410 Gone ERROR event, so only a new list shows them), GET /log (requests seen).

usage: k8s_standin.py CERT KEY TOKEN API_PORT CONTROL_PORT NODES_JSON
"""
import json
import ssl
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

CERT, KEY, TOKEN, API_PORT, CONTROL_PORT, NODES = sys.argv[1:7]
lock = threading.Condition()
state = {"rv": 1, "nodes": {}, "history": [], "gone": False, "log": []}


def bump(node):
    state["rv"] += 1
    node.setdefault("metadata", {})["resourceVersion"] = str(state["rv"])
    return node


def event(kind, node):
    state["history"].append((state["rv"], kind, json.loads(json.dumps(node))))
    lock.notify_all()


for n in json.load(open(NODES)):
    state["nodes"][n["metadata"]["name"]] = bump(n)


class Api(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

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

    def chunk(self, obj):
        data = (json.dumps(obj) + "\n").encode()
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def do_GET(self):
        url = urlparse(self.path)
        query = parse_qs(url.query)
        if url.path != "/api/v1/nodes":
            return self.status(404, "NotFound", "not served by the stand-in: " + url.path)
        watch = query.get("watch", ["0"])[0] in ("1", "true")
        if not watch:
            if not self.authorized("LIST"):
                return
            with lock:
                body = {"kind": "NodeList", "apiVersion": "v1",
                        "metadata": {"resourceVersion": str(state["rv"])},
                        "items": list(state["nodes"].values())}
            return self.reply(200, body)
        since = int(query.get("resourceVersion", ["0"])[0] or 0)
        if not self.authorized("WATCH %d" % since):
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        sent = since
        try:
            while True:
                with lock:
                    if state["gone"]:
                        state["gone"] = False
                        gone = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                                "message": "too old resource version: %d" % sent, "reason": "Expired",
                                "code": 410}
                        self.chunk({"type": "ERROR", "object": gone})
                        break
                    pending = [(rv, k, o) for (rv, k, o) in state["history"] if rv > sent]
                    if not pending:
                        lock.wait(timeout=1)
                        continue
                for rv, kind, obj in pending:
                    self.chunk({"type": kind, "object": obj})
                    sent = rv
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            pass
        self.close_connection = True

    def do_PATCH(self):
        name = urlparse(self.path).path.rsplit("/", 1)[-1]
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        if not self.authorized("PATCH " + name):
            return
        with lock:
            node = state["nodes"].get(name)
            if node is None:
                return self.status(404, "NotFound", "nodes %r not found" % name)
            notes = node["metadata"].setdefault("annotations", {})
            for k, v in body.get("metadata", {}).get("annotations", {}).items():
                if v is None:
                    notes.pop(k, None)
                else:
                    notes[k] = v
            event("MODIFIED", bump(node))
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
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        with lock:
            if url.path in ("/add", "/modify"):
                node = bump(json.loads(body))
                state["nodes"][node["metadata"]["name"]] = node
                event("ADDED" if url.path == "/add" else "MODIFIED", node)
            elif url.path == "/delete":
                name = parse_qs(url.query)["name"][0]
                node = bump(state["nodes"].pop(name))
                event("DELETED", node)
            elif url.path == "/gone":
                for node in json.loads(body or b"[]"):
                    state["nodes"][node["metadata"]["name"]] = bump(node)
                state["history"].clear()
                state["gone"] = True
                lock.notify_all()
        self.send_response(204)
        self.end_headers()


api = ThreadingHTTPServer(("127.0.0.1", int(API_PORT)), Api)
context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
context.load_cert_chain(CERT, KEY)
api.socket = context.wrap_socket(api.socket, server_side=True)
control = ThreadingHTTPServer(("127.0.0.1", int(CONTROL_PORT)), Control)
threading.Thread(target=control.serve_forever, daemon=True).start()
print("serving", flush=True)
api.serve_forever()
