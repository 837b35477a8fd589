#!/usr/bin/env python3
"""A loopback S3 stub that misbehaves on command, for the S3 tier's fault-path tests.

Usage: s3_stub.py [--min-part BYTES] [--fault SPEC]... [--verbose]

Binds 127.0.0.1 on a free port, prints one line "PORT <n>" and serves path-style S3 requests
(http://127.0.0.1:PORT/<bucket>/<key>) from memory until SIGTERM or until its stdin reaches EOF,
so a crashed parent leaves no orphan. Signatures are not checked, but every S3 request must carry
an "AWS4-HMAC-SHA256 Credential=" Authorization header.

Fault SPEC: <op>:<kind>[:<count>][:retry_after=<s>]
  op    put get head delete list initiate upload_part complete abort any
  kind  status=<code>[,<S3Code>]  answer that status with S3 error XML (retry_after= adds Retry-After)
        reset     send the headers (full Content-Length) and half the body, then RST. A mutating
                  op (put delete initiate upload_part complete abort) is instead dropped
                  unperformed with no answer at all, as is an answer without a body (head)
        truncate  as reset, but the connection is closed cleanly (FIN) instead of reset
        bad_etag  (put, upload_part) store normally, answer an ETag that is not the body's MD5
        bad_range (ranged get) 206 with a Content-Range shifted from the one asked for
        status200 (ranged get) 200 with the whole object
        chunked   (get) the same answer with its body in Transfer-Encoding: chunked
        delay=<ms> sleep before answering; stacks with one other fault on the same request
  A fault serves the next <count> (default 1) requests of its op that it applies to; faults are
  tried in the order they were added, and a request takes at most one delay and one other fault.

Control (no Authorization needed): GET /_stub/stats -> JSON; POST /_stub/fault (body: SPEC).
"""

import argparse
import base64
import hashlib
import http.server
import json
import os
import re
import signal
import socket
import struct
import sys
import threading
import time
import urllib.parse
import uuid
import xml.etree.ElementTree as ET
from xml.sax.saxutils import escape

OPS = ("put", "get", "head", "delete", "list", "initiate", "upload_part", "complete", "abort")
MUTATING = {"put", "delete", "initiate", "upload_part", "complete", "abort", "other"}
DEFAULT_CODES = {400: "BadRequest", 403: "AccessDenied", 404: "NoSuchKey", 409: "Conflict",
                 429: "TooManyRequests", 500: "InternalError", 501: "NotImplemented",
                 503: "SlowDown", 504: "GatewayTimeout"}


class Fault:
    """One parsed SPEC; `left` counts the requests it still serves."""

    def __init__(self, spec):
        self.spec = spec.strip()
        parts = self.spec.split(":")
        if len(parts) < 2 or parts[0] not in OPS + ("any",):
            raise ValueError(f"fault {self.spec!r}: expected <op>:<kind>, op one of {', '.join(OPS)}, any")
        self.op, kind = parts[0], parts[1]
        self.left, self.retry_after, self.delay_ms, self.status, self.s3code = 1, None, 0, 0, ""
        name, _, value = kind.partition("=")
        if name == "status":
            m = re.fullmatch(r"(\d{3})(?:,(\w+))?", value)
            if not m:
                raise ValueError(f"fault {self.spec!r}: expected status=<code>[,<S3Code>]")
            self.status = int(m[1])
            self.s3code = m[2] or DEFAULT_CODES.get(self.status, "InternalError")
        elif name == "delay" and value.isdigit():
            self.delay_ms = int(value)
        elif name not in ("reset", "truncate", "bad_etag", "bad_range", "status200", "chunked") or value:
            raise ValueError(f"fault {self.spec!r}: unknown kind {kind!r}")
        self.kind = name
        if self.kind == "bad_etag" and self.op not in ("put", "upload_part", "any"):
            raise ValueError(f"fault {self.spec!r}: bad_etag applies to put and upload_part")
        if self.kind in ("bad_range", "status200", "chunked") and self.op not in ("get", "any"):
            raise ValueError(f"fault {self.spec!r}: {self.kind} applies to get")
        rest = parts[2:]
        if rest and rest[0].isdigit():
            self.left = int(rest.pop(0))
        for opt in rest:
            m = re.fullmatch(r"retry_after=(\d+)", opt)
            if not m or self.kind != "status":
                raise ValueError(f"fault {self.spec!r}: unexpected {opt!r} (only status takes retry_after=<s>)")
            self.retry_after = int(m[1])
        if self.left < 1:
            raise ValueError(f"fault {self.spec!r}: count must be at least 1")

    def applies(self, op, ranged):
        if self.op not in (op, "any"):
            return False
        if self.kind == "bad_etag":
            return op in ("put", "upload_part")
        if self.kind in ("bad_range", "status200"):
            return op == "get" and ranged
        if self.kind == "chunked":
            return op == "get"
        return True


class State:
    """The stub's whole world, guarded by one lock."""

    def __init__(self, min_part, faults):
        self.lock = threading.Lock()
        self.min_part = min_part
        self.objects = {}   # (bucket, key) -> (bytes, etag without quotes)
        self.uploads = {}   # upload id -> {"bucket", "key", "parts": {n: (bytes, etag)}}
        self.faults = list(faults)
        self.counts = dict.fromkeys(OPS + ("other",), 0)
        self.requests = self.denied = self.fired = self.next_id = 0

    def request_id(self):
        with self.lock:
            self.next_id += 1
            return f"stub-{self.next_id}"

    def take_faults(self, op, ranged):
        """Counts the request and takes at most one delay fault and one other fault for it."""
        with self.lock:
            self.requests += 1
            self.counts[op] += 1
            taken = []
            for want_delay in (True, False):
                f = next((f for f in self.faults
                          if (f.kind == "delay") == want_delay and f.applies(op, ranged)), None)
                if f:
                    f.left -= 1
                    self.fired += 1
                    taken.append(f)
            self.faults = [f for f in self.faults if f.left > 0]
            return taken

    def stats(self):
        with self.lock:
            return {"requests": self.requests, "denied": self.denied, "ops": dict(self.counts),
                    "open_uploads": len(self.uploads), "objects": len(self.objects),
                    "faults_fired": self.fired,
                    "faults": [{"spec": f.spec, "left": f.left} for f in self.faults]}


def md5hex(data):
    return hashlib.md5(data).hexdigest()


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    state: State = None
    verbose = False

    def log_message(self, fmt, *args):
        if self.verbose:
            sys.stderr.write("s3_stub: " + (fmt % args) + "\n")

    do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = lambda self: self.handle_s3()

    # -- sending ---------------------------------------------------------------------------------

    def answer(self, status, body=b"", headers=(), fault=None):
        """Sends one response; `fault` (reset/truncate) cuts it short."""
        if fault and fault.kind in ("reset", "truncate") and not body:
            return self.cut(fault.kind, None)
        self.send_response(status)
        self.send_header("x-amz-request-id", self.rid)
        for k, v in headers:
            self.send_header(k, v)
        chunked = fault and fault.kind == "chunked" and self.command != "HEAD"
        if chunked:
            self.send_header("Transfer-Encoding", "chunked")
        elif not any(k.lower() == "content-length" for k, _ in headers):
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command == "HEAD":
            return
        if chunked:
            half = len(body) // 2
            for piece in (body[:half], body[half:]):
                if piece:
                    self.wfile.write(b"%x\r\n" % len(piece) + piece + b"\r\n")
            return self.wfile.write(b"0\r\n\r\n")
        if fault and fault.kind in ("reset", "truncate"):
            return self.cut(fault.kind, body[: len(body) // 2])
        self.wfile.write(body)

    def cut(self, kind, partial):
        if partial is not None:
            self.wfile.write(partial)
        self.close_connection = True
        if kind == "reset":
            # Linger 0 turns close() into an RST; rfile holds a reference that would defer it.
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.rfile.close()
            self.connection.close()

    def error(self, status, code, message, headers=(), fault=None):
        body = (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code>'
                f"<Message>{escape(message)}</Message><Resource>{escape(self.path)}</Resource>"
                f"<RequestId>{self.rid}</RequestId></Error>").encode()
        if self.command == "HEAD":  # a HEAD answer has no body to describe the error
            headers, body = list(headers) + [("Content-Length", "0")], b""
        self.answer(status, body, [("Content-Type", "application/xml"), *headers], fault)

    def xml(self, status, body, fault=None):
        self.answer(status, ('<?xml version="1.0" encoding="UTF-8"?>\n' + body).encode(),
                    [("Content-Type", "application/xml")], fault)

    # -- dispatch --------------------------------------------------------------------------------

    def read_body(self):
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            return None
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n else b""

    def handle_s3(self):
        self.rid, self.op = self.state.request_id(), "other"
        body = self.read_body()
        url = urllib.parse.urlsplit(self.path)
        query = urllib.parse.parse_qs(url.query, keep_blank_values=True)
        q = {k: v[0] for k, v in query.items()}
        if body is None:  # S3 refuses chunked uploads without aws-chunked signing; so do we
            self.close_connection = True
            return self.error(411, "MissingContentLength", "You must provide the Content-Length HTTP header.")
        if url.path.startswith("/_stub/"):
            return self.control(url.path, body)
        if not self.headers.get("Authorization", "").startswith("AWS4-HMAC-SHA256 Credential="):
            with self.state.lock:
                self.state.denied += 1
            return self.error(403, "AccessDenied", "request is not signed with AWS4-HMAC-SHA256")
        bucket, _, key = url.path.lstrip("/").partition("/")
        bucket, key = urllib.parse.unquote(bucket), urllib.parse.unquote(key)
        self.op = self.classify(bool(key), q)
        ranged = "Range" in self.headers
        faults = self.state.take_faults(self.op, ranged)
        fault = next((f for f in faults if f.kind != "delay"), None)
        for f in faults:
            if f.kind == "delay":
                time.sleep(f.delay_ms / 1000)
        if fault and fault.kind == "status":
            hdrs = [("Retry-After", str(fault.retry_after))] if fault.retry_after is not None else []
            return self.error(fault.status, fault.s3code, "injected fault " + fault.spec, hdrs)
        if fault and fault.kind in ("reset", "truncate") and self.op in MUTATING:
            return self.cut(fault.kind, None)  # dropped unperformed, so a retry is always safe
        sha = self.headers.get("x-amz-content-sha256")
        if sha and sha != "UNSIGNED-PAYLOAD" and sha != hashlib.sha256(body).hexdigest():
            return self.error(400, "XAmzContentSHA256Mismatch",
                              "The provided 'x-amz-content-sha256' header does not match what was computed.",
                              fault=fault)
        if not bucket:
            return self.error(501, "NotImplemented", "the stub serves path-style bucket requests only", fault=fault)
        getattr(self, "op_" + self.op)(bucket, key, q, body, fault)

    def classify(self, has_key, q):
        m = self.command
        if not has_key:
            return "list" if m == "GET" else "head" if m == "HEAD" else "other"
        if m == "POST":
            return "initiate" if "uploads" in q else "complete" if "uploadId" in q else "other"
        if m == "PUT":
            return "upload_part" if "uploadId" in q else "put"
        if m == "DELETE":
            return "abort" if "uploadId" in q else "delete"
        return {"GET": "get", "HEAD": "head"}[m]

    def control(self, path, body):
        if path == "/_stub/stats" and self.command == "GET":
            return self.answer(200, json.dumps(self.state.stats()).encode(),
                               [("Content-Type", "application/json")])
        if path == "/_stub/fault" and self.command == "POST":
            try:
                fault = Fault(body.decode())
            except (ValueError, UnicodeDecodeError) as e:
                return self.answer(400, str(e).encode(), [("Content-Type", "text/plain")])
            with self.state.lock:
                self.state.faults.append(fault)
            return self.answer(200, b"ok\n", [("Content-Type", "text/plain")])
        self.answer(404, b"no such control endpoint\n", [("Content-Type", "text/plain")])

    # -- operations ------------------------------------------------------------------------------

    def op_other(self, bucket, key, q, body, fault):
        if self.command == "PUT" and not key and not q:  # CreateBucket: every bucket exists already
            return self.answer(200, fault=fault)
        self.error(501, "NotImplemented", f"the stub does not implement {self.command} {self.path}", fault=fault)

    def op_put(self, bucket, key, q, body, fault):
        etag = md5hex(body)
        with self.state.lock:
            self.state.objects[(bucket, key)] = (body, etag)
        if fault and fault.kind == "bad_etag":
            etag = md5hex(body + b"bad")
        self.answer(200, headers=[("ETag", f'"{etag}"')], fault=fault)

    def find(self, bucket, key, fault):
        with self.state.lock:
            obj = self.state.objects.get((bucket, key))
        if obj is None:
            self.error(404, "NoSuchKey", "The specified key does not exist.", fault=fault)
        return obj

    def op_head(self, bucket, key, q, body, fault):
        if not key:
            return self.answer(200, fault=fault)
        if obj := self.find(bucket, key, fault):
            self.answer(200, headers=[("Content-Length", str(len(obj[0]))), ("ETag", f'"{obj[1]}"'),
                                      ("Accept-Ranges", "bytes")], fault=fault)

    def op_get(self, bucket, key, q, body, fault):
        if not (obj := self.find(bucket, key, fault)):
            return
        data, etag = obj
        total, hdrs = len(data), [("ETag", f'"{etag}"'), ("Accept-Ranges", "bytes")]
        m = re.fullmatch(r"bytes=(\d*)-(\d*)", self.headers.get("Range", "").strip())
        if not m or m[1] == m[2] == "" or (fault and fault.kind == "status200"):
            return self.answer(200, data, hdrs, fault)  # S3 ignores a Range it cannot parse
        if m[1] == "":
            a, b = max(total - int(m[2]), 0), total - 1
        else:
            a, b = int(m[1]), min(int(m[2]) if m[2] else total - 1, total - 1)
        if a >= total or a > b:
            return self.error(416, "InvalidRange", "The requested range is not satisfiable",
                              [("Content-Range", f"bytes */{total}")], fault)
        if fault and fault.kind == "bad_range":
            # Claim (and send) the range one byte off the one asked for, so the tier must compare.
            if b + 1 >= total and a > 0:
                a, b = a - 1, b - 1
            else:  # shift up; for the whole object, pretend it is one byte longer
                a, b = a + 1, b + 1
                data, total = data + b"\0" * (b + 1 - total), max(total, b + 1)
        hdrs.append(("Content-Range", f"bytes {a}-{b}/{total}"))
        self.answer(206, data[a: b + 1], hdrs, fault)

    def op_delete(self, bucket, key, q, body, fault):
        with self.state.lock:
            self.state.objects.pop((bucket, key), None)
        self.answer(204, fault=fault)

    def op_list(self, bucket, key, q, body, fault):
        if q.get("list-type") != "2" or q.get("delimiter"):
            return self.error(501, "NotImplemented", "the stub lists with list-type=2 and no delimiter", fault=fault)
        prefix, token = q.get("prefix", ""), q.get("continuation-token")
        try:
            max_keys = min(int(q.get("max-keys") or 1000), 1000)
            after = base64.urlsafe_b64decode(token).decode() if token else q.get("start-after", "")
        except ValueError:  # binascii.Error and UnicodeDecodeError are ValueErrors
            max_keys = -1
        if max_keys < 0:
            return self.error(400, "InvalidArgument", "bad max-keys or continuation-token", fault=fault)
        with self.state.lock:
            keys = sorted((k, len(d), e) for (bk, k), (d, e) in self.state.objects.items()
                          if bk == bucket and k.startswith(prefix) and k > after)
        page, truncated = keys[:max_keys], 0 < max_keys < len(keys)
        out = [f"<ListBucketResult><Name>{escape(bucket)}</Name><Prefix>{escape(prefix)}</Prefix>",
               f"<MaxKeys>{max_keys}</MaxKeys><KeyCount>{len(page)}</KeyCount>",
               f"<IsTruncated>{'true' if truncated else 'false'}</IsTruncated>"]
        if token:
            out.append(f"<ContinuationToken>{escape(token)}</ContinuationToken>")
        if truncated:  # the token is the last key returned: listing resumes after it
            nxt = base64.urlsafe_b64encode(page[-1][0].encode()).decode()
            out.append(f"<NextContinuationToken>{nxt}</NextContinuationToken>")
        for k, size, etag in page:
            out.append(f"<Contents><Key>{escape(k)}</Key><Size>{size}</Size>"
                       f"<ETag>&quot;{etag}&quot;</ETag><StorageClass>STANDARD</StorageClass></Contents>")
        self.xml(200, "".join(out) + "</ListBucketResult>", fault)

    def op_initiate(self, bucket, key, q, body, fault):
        uid = uuid.uuid4().hex
        with self.state.lock:
            self.state.uploads[uid] = {"bucket": bucket, "key": key, "parts": {}}
        self.xml(200, f"<InitiateMultipartUploadResult><Bucket>{escape(bucket)}</Bucket>"
                      f"<Key>{escape(key)}</Key><UploadId>{uid}</UploadId></InitiateMultipartUploadResult>", fault)

    def upload(self, bucket, key, q, fault):
        with self.state.lock:
            up = self.state.uploads.get(q["uploadId"])
        if up is None or (up["bucket"], up["key"]) != (bucket, key):
            self.error(404, "NoSuchUpload", "The specified upload does not exist.", fault=fault)
            return None
        return up

    def op_upload_part(self, bucket, key, q, body, fault):
        n = q.get("partNumber", "")
        if not n.isdigit() or not 1 <= int(n) <= 10000:
            return self.error(400, "InvalidArgument", "Part number must be an integer between 1 and 10000", fault=fault)
        if not (up := self.upload(bucket, key, q, fault)):
            return
        etag = md5hex(body)
        with self.state.lock:
            up["parts"][int(n)] = (body, etag)
        if fault and fault.kind == "bad_etag":
            etag = md5hex(body + b"bad")
        self.answer(200, headers=[("ETag", f'"{etag}"')], fault=fault)

    def op_complete(self, bucket, key, q, body, fault):
        if not (up := self.upload(bucket, key, q, fault)):
            return
        try:
            listed = [(int(p.findtext("{*}PartNumber")), p.findtext("{*}ETag").strip().strip('"'))
                      for p in ET.fromstring(body).iter() if p.tag.split("}")[-1] == "Part"]
        except (ET.ParseError, TypeError, ValueError, AttributeError):
            return self.error(400, "MalformedXML", "The XML you provided was not well-formed.", fault=fault)
        if not listed:
            return self.error(400, "MalformedXML", "CompleteMultipartUpload lists no part.", fault=fault)
        numbers = [n for n, _ in listed]
        if numbers != sorted(set(numbers)):
            return self.error(400, "InvalidPartOrder", "The list of parts was not in ascending order.", fault=fault)
        with self.state.lock:
            parts = dict(up["parts"])
        for i, (n, etag) in enumerate(listed):
            if n not in parts or parts[n][1] != etag:
                return self.error(400, "InvalidPart", f"part {n} was not uploaded or its ETag does not match.",
                                  fault=fault)
            if i + 1 < len(listed) and len(parts[n][0]) < self.state.min_part:
                return self.error(400, "EntityTooSmall",
                                  f"part {n} is {len(parts[n][0])} bytes, under the minimum {self.state.min_part}",
                                  fault=fault)
        data = b"".join(parts[n][0] for n, _ in listed)
        etag = md5hex(b"".join(bytes.fromhex(e) for _, e in listed)) + f"-{len(listed)}"
        with self.state.lock:
            self.state.objects[(bucket, key)] = (data, etag)
            self.state.uploads.pop(q["uploadId"], None)
        self.xml(200, f"<CompleteMultipartUploadResult><Bucket>{escape(bucket)}</Bucket><Key>{escape(key)}</Key>"
                      f"<ETag>&quot;{etag}&quot;</ETag></CompleteMultipartUploadResult>", fault)

    def op_abort(self, bucket, key, q, body, fault):
        if self.upload(bucket, key, q, fault):
            with self.state.lock:
                self.state.uploads.pop(q["uploadId"], None)
            self.answer(204, fault=fault)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--fault", action="append", default=[], metavar="SPEC")
    ap.add_argument("--min-part", type=int, default=5 << 20, metavar="BYTES",
                    help="minimum size of a multipart part other than the last (default 5 MiB)")
    ap.add_argument("--verbose", action="store_true", help="log each request to stderr")
    args = ap.parse_args()
    try:
        faults = [Fault(s) for s in args.fault]
    except ValueError as e:
        ap.error(str(e))
    Handler.state, Handler.verbose = State(args.min_part, faults), args.verbose

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))

    def watch_stdin():  # EOF on stdin means the parent is gone
        while sys.stdin.buffer.read1(65536):
            pass
        os._exit(0)

    threading.Thread(target=watch_stdin, daemon=True).start()
    print(f"PORT {server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
