#!/usr/bin/env python3
"""Checks s3_stub.py: every S3 operation and every fault kind, over http.client.

A plain script (exit 0 when every check passes, 1 otherwise), kept out of pytest's collection on
purpose: ctest runs it. Usage: s3_stub_check.py [path/to/s3_stub.py]
"""

import hashlib
import http.client
import json
import os
import re
import signal
import subprocess
import sys
import time
import traceback
import xml.etree.ElementTree as ET

STUB = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "s3_stub.py")
AUTH = "AWS4-HMAC-SHA256 Credential=test/20240101/us-east-1/s3/aws4_request, SignedHeaders=host, Signature=00"
MIN_PART = 64


class Stub:
    def __init__(self, *args):
        self.proc = subprocess.Popen([sys.executable, STUB, *args], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        m = re.fullmatch(r"PORT (\d+)\n", line)
        if not m:
            self.close()
            raise RuntimeError(f"the stub printed {line!r}, not a PORT line")
        self.port = int(m[1])
        self.conn = self.connect()

    def connect(self):
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)

    def close(self):
        if self.proc.poll() is None:
            self.proc.terminate()
        self.proc.wait(timeout=10)

    def req(self, method, path, body=None, headers=None, auth=True, conn=None):
        """One request on the kept-alive connection; returns (status, headers, body)."""
        h = {"Authorization": AUTH} if auth else {}
        h.update(headers or {})
        c = conn or self.conn
        c.request(method, path, body=body, headers=h)
        r = c.getresponse()
        data = r.read()
        assert r.getheader("x-amz-request-id", "").startswith("stub-"), "every response has x-amz-request-id"
        if method != "HEAD" and r.getheader("Transfer-Encoding") != "chunked":
            assert int(r.getheader("Content-Length")) == len(data), "Content-Length matches the body"
        return r.status, r, data

    def stats(self):
        c = self.connect()
        try:
            status, _, data = self.req("GET", "/_stub/stats", auth=False, conn=c)
            assert status == 200
            return json.loads(data)
        finally:
            c.close()

    def fault(self, spec):
        c = self.connect()
        try:
            return self.req("POST", "/_stub/fault", body=spec.encode(), auth=False, conn=c)[0]
        finally:
            c.close()


def error_code(data):
    root = ET.fromstring(data)
    assert root.tag == "Error" and root.findtext("RequestId").startswith("stub-"), data
    return root.findtext("Code")


def md5q(data):
    return '"' + hashlib.md5(data).hexdigest() + '"'


def check_basic(s):
    status, r, data = s.req("PUT", "/b/k", b"x", auth=False)
    assert status == 403 and error_code(data) == "AccessDenied"
    body = bytes(range(256)) * 4
    status, r, _ = s.req("PUT", "/b/dir/k%201", body)
    assert status == 200 and r.getheader("ETag") == md5q(body)
    sha = hashlib.sha256(body).hexdigest()
    assert s.req("PUT", "/b/dir/k%201", body, {"x-amz-content-sha256": sha})[0] == 200
    assert s.req("PUT", "/b/dir/k%201", body, {"x-amz-content-sha256": "UNSIGNED-PAYLOAD"})[0] == 200
    status, _, data = s.req("PUT", "/b/dir/k%201", body, {"x-amz-content-sha256": "0" * 64})
    assert status == 400 and error_code(data) == "XAmzContentSHA256Mismatch"
    status, r, data = s.req("GET", "/b/dir/k%201")
    assert status == 200 and data == body and r.getheader("ETag") == md5q(body)
    status, r, data = s.req("GET", "/b/dir/k%201", headers={"Range": "bytes=10-19"})
    assert status == 206 and data == body[10:20] and r.getheader("Content-Range") == "bytes 10-19/1024"
    status, r, data = s.req("GET", "/b/dir/k%201", headers={"Range": "bytes=1000-5000"})
    assert status == 206 and data == body[1000:] and r.getheader("Content-Range") == "bytes 1000-1023/1024"
    status, r, data = s.req("GET", "/b/dir/k%201", headers={"Range": "bytes=-4"})
    assert status == 206 and data == body[-4:]
    status, r, data = s.req("GET", "/b/dir/k%201", headers={"Range": "bytes=1024-1100"})
    assert status == 416 and error_code(data) == "InvalidRange"
    status, _, data = s.req("GET", "/b/missing")
    assert status == 404 and error_code(data) == "NoSuchKey"
    status, r, data = s.req("HEAD", "/b/dir/k%201")
    assert status == 200 and data == b"" and r.getheader("Content-Length") == "1024"
    assert r.getheader("ETag") == md5q(body)
    assert s.req("HEAD", "/b/missing")[0] == 404
    assert s.req("HEAD", "/b")[0] == 200
    assert s.req("DELETE", "/b/dir/k%201")[0] == 204
    assert s.req("DELETE", "/b/dir/k%201")[0] == 204
    assert s.req("GET", "/b/dir/k%201")[0] == 404
    st = s.stats()
    assert st["ops"]["put"] == 4 and st["ops"]["get"] == 7 and st["ops"]["head"] == 3, st
    assert st["ops"]["delete"] == 2 and st["denied"] == 1 and st["requests"] == 16, st


def check_list(s):
    keys = [f"p/{i:02d}" for i in range(7)] + ["q/other"]
    for k in keys:
        assert s.req("PUT", f"/lb/{k}", k.encode())[0] == 200
    seen, token, pages = [], None, 0
    while True:
        path = "/lb?list-type=2&prefix=p%2F&max-keys=3"
        if token:
            path += "&continuation-token=" + token
        status, _, data = s.req("GET", path)
        assert status == 200, data
        root = ET.fromstring(data)
        page = [(c.findtext("Key"), int(c.findtext("Size")), c.findtext("ETag")) for c in root.iter("Contents")]
        assert int(root.findtext("KeyCount")) == len(page) <= 3
        seen += page
        pages += 1
        if root.findtext("IsTruncated") != "true":
            assert root.find("NextContinuationToken") is None
            break
        token = root.findtext("NextContinuationToken")
    assert pages == 3 and [k for k, _, _ in seen] == keys[:7], seen
    assert all(size == len(k) and etag == md5q(k.encode()) for k, size, etag in seen)
    status, _, data = s.req("GET", "/lb?list-type=2")
    assert int(ET.fromstring(data).findtext("KeyCount")) == 8


def multipart_upload(s, key, parts, complete_etags=None):
    status, _, data = s.req("POST", f"/mb/{key}?uploads")
    assert status == 200, data
    uid = ET.fromstring(data).findtext("UploadId")
    etags = []
    for n, part in enumerate(parts, 1):
        status, r, _ = s.req("PUT", f"/mb/{key}?partNumber={n}&uploadId={uid}", part)
        assert status == 200 and r.getheader("ETag") == md5q(part)
        etags.append(r.getheader("ETag"))
    xml = "<CompleteMultipartUpload>" + "".join(
        f"<Part><PartNumber>{n}</PartNumber><ETag>{e}</ETag></Part>"
        for n, e in enumerate(complete_etags or etags, 1)) + "</CompleteMultipartUpload>"
    status, _, data = s.req("POST", f"/mb/{key}?uploadId={uid}", xml.encode())
    return uid, status, data


def check_multipart(s):
    parts = [b"a" * MIN_PART, b"b" * (MIN_PART + 3), b"c" * 5]
    uid, status, data = multipart_upload(s, "big", parts)
    assert status == 200 and ET.fromstring(data).tag == "CompleteMultipartUploadResult", data
    status, r, got = s.req("GET", "/mb/big")
    assert got == b"".join(parts) and r.getheader("ETag").endswith('-3"')
    assert s.stats()["open_uploads"] == 0
    uid, status, data = multipart_upload(s, "bad", parts, ['"' + "0" * 32 + '"'] * 3)
    assert status == 400 and error_code(data) == "InvalidPart"
    uid2, status, data = multipart_upload(s, "small", [b"x" * (MIN_PART - 1), b"y"])
    assert status == 400 and error_code(data) == "EntityTooSmall"
    assert s.stats()["open_uploads"] == 2
    assert s.req("DELETE", f"/mb/bad?uploadId={uid}")[0] == 204
    assert s.req("DELETE", f"/mb/small?uploadId={uid2}")[0] == 204
    status, _, data = s.req("PUT", f"/mb/bad?partNumber=1&uploadId={uid}", b"z")
    assert status == 404 and error_code(data) == "NoSuchUpload"
    st = s.stats()
    assert st["open_uploads"] == 0 and st["ops"]["initiate"] == 3 and st["ops"]["abort"] == 2, st
    assert st["ops"]["upload_part"] == 9 and st["ops"]["complete"] == 3, st


def check_faults(s):
    body = bytes(range(200))
    assert s.req("PUT", "/fb/k", body)[0] == 200
    # status with count and Retry-After: exactly two answers, then the fault is used up
    assert s.fault("get:status=503,SlowDown:2:retry_after=1") == 200
    assert s.stats()["faults"] == [{"spec": "get:status=503,SlowDown:2:retry_after=1", "left": 2}]
    for _ in range(2):
        status, r, data = s.req("GET", "/fb/k")
        assert status == 503 and error_code(data) == "SlowDown" and r.getheader("Retry-After") == "1"
    assert s.req("GET", "/fb/k")[2] == body and s.stats()["faults"] == []
    assert s.fault("put:status=500") == 200
    status, r, data = s.req("PUT", "/fb/k", b"lost")
    assert status == 500 and error_code(data) == "InternalError" and r.getheader("Retry-After") is None
    assert s.req("GET", "/fb/k")[2] == body, "a failed put stores nothing"
    assert s.fault("head:status=404") == 200
    status, r, data = s.req("HEAD", "/fb/k")
    assert status == 404 and data == b""
    assert s.fault("nonsense") == 400 and s.fault("put:bad_range") == 400 and s.fault("get:reset:2:x=1") == 400

    # reset: headers and half the body, then RST
    s.fault("get:reset")
    c = s.connect()
    c.request("GET", "/fb/k", headers={"Authorization": AUTH})
    r = c.getresponse()
    assert r.status == 200 and r.getheader("Content-Length") == "200"
    try:
        got = r.read()
        raise AssertionError(f"read {len(got)} bytes, no reset")
    except ConnectionResetError:
        pass
    except http.client.IncompleteRead as e:
        raise AssertionError(f"clean close after {len(e.partial)} bytes, not a reset") from None
    c.close()
    # truncate: headers and half the body, then a clean close
    s.fault("get:truncate")
    c = s.connect()
    c.request("GET", "/fb/k", headers={"Authorization": AUTH, "Range": "bytes=0-99"})
    r = c.getresponse()
    assert r.status == 206
    try:
        r.read()
        raise AssertionError("no short body")
    except http.client.IncompleteRead as e:
        assert e.partial == body[:50], e.partial
    c.close()
    # a mutating op is dropped unperformed: no answer at all
    s.fault("put:reset")
    c = s.connect()
    c.request("PUT", "/fb/k2", body=b"dropped", headers={"Authorization": AUTH})
    try:
        c.getresponse()
        raise AssertionError("an answer came")
    except (ConnectionResetError, http.client.RemoteDisconnected):
        pass
    c.close()
    s.fault("complete:truncate")
    s.conn = s.connect()
    parts = [b"a" * MIN_PART, b"b"]
    try:
        multipart_upload(s, "cut", parts)
        raise AssertionError("an answer came")
    except http.client.RemoteDisconnected:
        pass
    s.conn = s.connect()
    assert s.req("GET", "/fb/k2")[0] == 404 and s.req("GET", "/mb/cut")[0] == 404
    assert s.stats()["open_uploads"] == 1, "the dropped complete left the upload open"

    # bad_etag stores but lies about the ETag
    s.fault("put:bad_etag")
    status, r, _ = s.req("PUT", "/fb/e", b"etag")
    assert status == 200 and r.getheader("ETag") != md5q(b"etag") and s.req("GET", "/fb/e")[2] == b"etag"
    s.fault("upload_part:bad_etag")
    status, _, data = s.req("POST", "/mb/be?uploads")
    uid = ET.fromstring(data).findtext("UploadId")
    status, r, _ = s.req("PUT", f"/mb/be?partNumber=1&uploadId={uid}", b"part")
    assert status == 200 and r.getheader("ETag") != md5q(b"part")
    s.req("DELETE", f"/mb/be?uploadId={uid}")

    # bad_range shifts the Content-Range; an unranged GET does not use it up
    s.fault("get:bad_range:3")
    assert s.req("GET", "/fb/k")[0] == 200 and s.stats()["faults"][0]["left"] == 3
    for asked, claimed, data_range in (("bytes=10-19", "bytes 11-20/200", body[11:21]),
                                       ("bytes=190-199", "bytes 189-198/200", body[189:199]),
                                       ("bytes=0-199", "bytes 1-200/201", body[1:] + b"\0")):
        status, r, data = s.req("GET", "/fb/k", headers={"Range": asked})
        assert status == 206 and r.getheader("Content-Range") == claimed and data == data_range, asked
    # status200 answers a ranged GET with the whole object
    s.fault("get:status200")
    status, r, data = s.req("GET", "/fb/k", headers={"Range": "bytes=5-9"})
    assert status == 200 and data == body and r.getheader("Content-Range") is None
    # chunked frames the same answer in Transfer-Encoding: chunked (http.client decodes it)
    s.fault("get:chunked")
    status, r, data = s.req("GET", "/fb/k", headers={"Range": "bytes=5-9"})
    assert status == 206 and data == body[5:10] and r.getheader("Transfer-Encoding") == "chunked"
    assert r.getheader("Content-Length") is None
    # delay stacks with another fault; "any" matches every op
    s.fault("any:delay=300")
    s.fault("any:status=503")
    t = time.monotonic()
    status, _, data = s.req("HEAD", "/fb/k")
    assert status == 503 and time.monotonic() - t >= 0.3
    assert s.req("HEAD", "/fb/k")[0] == 200
    st = s.stats()
    assert st["faults"] == [] and st["faults_fired"] == 17, st


def check_cli_faults():
    s = Stub("--fault", "put:status=503,SlowDown:3", "--fault", "list:delay=200")
    try:
        for _ in range(3):
            assert s.req("PUT", "/b/k", b"1")[0] == 503
        assert s.req("PUT", "/b/k", b"1")[0] == 200
        t = time.monotonic()
        assert s.req("GET", "/b?list-type=2")[0] == 200 and time.monotonic() - t >= 0.2
        assert s.stats()["ops"]["put"] == 4
    finally:
        s.close()
    bad = subprocess.run([sys.executable, STUB, "--fault", "put:explode"], stdin=subprocess.DEVNULL,
                         capture_output=True, text=True, timeout=30)
    assert bad.returncode == 2 and "unknown kind" in bad.stderr, bad


def check_lifetime():
    s = Stub()
    s.proc.stdin.close()  # the parent going away
    assert s.proc.wait(timeout=10) == 0
    s = Stub()
    s.proc.send_signal(signal.SIGTERM)
    assert s.proc.wait(timeout=10) == 0


def main():
    failed = 0
    s = Stub("--min-part", str(MIN_PART))
    checks = [("basic", lambda: check_basic(s)), ("list", lambda: check_list(s)),
              ("multipart", lambda: check_multipart(s)), ("faults", lambda: check_faults(s)),
              ("cli faults", check_cli_faults), ("lifetime", check_lifetime)]
    try:
        for name, check in checks:
            try:
                check()
                print(f"ok   {name}")
            except Exception:
                failed += 1
                print(f"FAIL {name}")
                traceback.print_exc()
                s.conn = s.connect()  # a failed check may leave the connection mid-response
    finally:
        s.close()
    print("s3_stub_check:", "FAILED" if failed else "passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
