#!/usr/bin/env python3
"""A minimal CRI client for the end-to-end test (tests/tests/cri.rs).

    cri.py SOCKET METHOD < request.json

Calls runtime.v1.RuntimeService/METHOD (Version, RunPodSandbox, StopPodSandbox, RemovePodSandbox,
PodSandboxStatus, ListPodSandbox) on the unix socket SOCKET with the METHODRequest read as JSON
(proto field names) from stdin, and prints the response as JSON with proto field names. A gRPC
error prints `grpc CODE: DETAILS` on stderr and exits 2.

The messages come from api.proto beside this file, compiled at run time by grpcio-tools
(`grpc.protos_and_services`), so no generated code is kept in the repository.
"""
import os
import sys

import grpc
from google.protobuf import json_format


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: cri.py SOCKET METHOD < request.json")
    socket, method = sys.argv[1], sys.argv[2]
    # protos_and_services resolves the name against sys.path; put this directory first.
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    protos, services = grpc.protos_and_services("api.proto")
    request_type = getattr(protos, method + "Request", None)
    if request_type is None:
        sys.exit(f"cri.py: unknown method {method}")
    request = json_format.Parse(sys.stdin.read() or "{}", request_type())
    with grpc.insecure_channel("unix://" + os.path.abspath(socket)) as channel:
        stub = services.RuntimeServiceStub(channel)
        try:
            response = getattr(stub, method)(request, timeout=60)
        except grpc.RpcError as e:
            print(f"grpc {e.code().name}: {e.details()}", file=sys.stderr)
            sys.exit(2)
    print(json_format.MessageToJson(response, preserving_proto_field_name=True))


if __name__ == "__main__":
    main()
