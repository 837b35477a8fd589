"""Runs a command against an S3 endpoint that accepts connections and never answers, and checks how
it fails:

    python3 silent_endpoint.py --expect-rc N --expect-output REGEX -- <command> [args...]

The endpoint listens on 127.0.0.1 on a port chosen at run time, reads and drops whatever comes
and answers nothing. The command gets AWS_ENDPOINT_URL naming it (and test credentials and
region unless the environment has them). It must exit with N, print one line in all (stdout
and stderr together) and that line must match REGEX. The caller's timeout (ctest's TIMEOUT) is the
guard on how long it may take; the time it took is printed.
"""
import argparse
import os
import re
import selectors
import socket
import subprocess
import sys
import threading
import time


def serve(listener: socket.socket, stop: threading.Event) -> None:
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ)
    while not stop.is_set():
        for key, _ in sel.select(timeout=0.2):
            if key.fileobj is listener:
                conn, _ = listener.accept()
                sel.register(conn, selectors.EVENT_READ)
                continue
            try:
                data = key.fileobj.recv(65536)
            except OSError:
                data = b""
            if not data:  # the client gave up: forget it
                sel.unregister(key.fileobj)
                key.fileobj.close()


def main() -> int:
    argv = sys.argv[1:]
    if "--" not in argv:
        sys.exit("silent_endpoint.py: no command after --")
    split = argv.index("--")
    parser = argparse.ArgumentParser()
    parser.add_argument("--expect-rc", type=int, required=True)
    parser.add_argument("--expect-output", required=True)
    args = parser.parse_args(argv[:split])
    command = argv[split + 1:]

    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    endpoint = "http://127.0.0.1:%d" % listener.getsockname()[1]
    stop = threading.Event()
    server = threading.Thread(target=serve, args=(listener, stop), daemon=True)
    server.start()

    env = dict(os.environ)
    env["AWS_ENDPOINT_URL"] = endpoint
    env.pop("AWS_ENDPOINT_URL_S3", None)
    env.setdefault("AWS_ACCESS_KEY_ID", "SILENTKEY")
    env.setdefault("AWS_SECRET_ACCESS_KEY", "silent-secret")
    env.setdefault("AWS_REGION", "us-east-1")
    print("endpoint %s: %s" % (endpoint, " ".join(command)), flush=True)
    t0 = time.monotonic()
    done = subprocess.run(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, check=False)
    took = time.monotonic() - t0
    stop.set()
    server.join()
    output = done.stdout + done.stderr
    print("--- exit code %d after %.1f s; stdout:\n%s--- stderr:\n%s---" % (done.returncode, took, done.stdout, done.stderr))
    lines = [line for line in output.splitlines() if line.strip()]
    failures = []
    if done.returncode != args.expect_rc:
        failures.append("exit code %d, expected %d" % (done.returncode, args.expect_rc))
    if len(lines) != 1:
        failures.append("%d lines of output, expected one" % len(lines))
    if not re.search(args.expect_output, output):
        failures.append("the output does not match '%s'" % args.expect_output)
    for f in failures:
        print("FAIL: " + f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
