"""An OTLP/HTTP trace receiver for the tests and the benchmarks: it decodes what summaryd
exports with the OpenTelemetry project's own protobuf classes (`opentelemetry-proto` from
PyPI), not with summaryd's code, so a span counts only if a real collector would read it.

Run it through scripts/otlp-receiver.sh, which installs the pinned packages into a venv:

    scripts/otlp-receiver.sh [--port N] [--delay-s S] [--status CODE] [--exit-on-stdin-eof]

It listens on 127.0.0.1 (port 0: one the kernel picks) and prints `LISTENING <port>` on
stdout once it accepts connections; nothing else goes to stdout.

    POST   /v1/traces  application/x-protobuf ExportTraceServiceRequest, plain or gzip;
                       answered 200 with an empty ExportTraceServiceResponse (or --status)
    GET    /spans      every span kept so far, as a JSON array (the shape: span_json below)
    DELETE /spans      forget them
    GET    /stats      {"exports": accepted requests, "rejected": requests answered with
                        --status or refused as malformed, "spans": spans kept}

--delay-s S holds every export's answer for S seconds (a slow collector); the spans of a
held export are kept only when it is answered, as a collector acknowledges what it stored.
GET and DELETE are never held: each request has its own thread. --status CODE answers every
export with CODE and keeps nothing (a collector refusing, e.g. 503).

`--print-sample plain|gzip` writes a hand-built ExportTraceServiceRequest to stdout and
exits: the receiver's self-test (tests/it/otlp_receiver.rs) posts it and checks what comes
back (SAMPLE_* below are its identifiers).
"""

import argparse
import gzip
import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, Span, Status

PROTOBUF = "application/x-protobuf"


def any_value(value):
    """An AnyValue as plain JSON: ints stay ints (JSON numbers), bytes become hex."""
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [any_value(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return attributes(value.kvlist_value.values)
    if kind == "bytes_value":
        return value.bytes_value.hex()
    return getattr(value, kind)


def attributes(key_values):
    return {kv.key: any_value(kv.value) for kv in key_values}


def span_json(span, resource, scope):
    return {
        "trace_id": span.trace_id.hex(),
        "span_id": span.span_id.hex(),
        # A root span has no parent: null rather than "", so a test cannot mistake one.
        "parent_span_id": span.parent_span_id.hex() or None,
        "trace_state": span.trace_state,
        "name": span.name,
        "kind": Span.SpanKind.Name(span.kind),
        "start_time_unix_nano": span.start_time_unix_nano,
        "end_time_unix_nano": span.end_time_unix_nano,
        "attributes": attributes(span.attributes),
        "events": [
            {
                "name": e.name,
                "time_unix_nano": e.time_unix_nano,
                "attributes": attributes(e.attributes),
            }
            for e in span.events
        ],
        "links": [
            {
                "trace_id": link.trace_id.hex(),
                "span_id": link.span_id.hex(),
                "trace_state": link.trace_state,
                "attributes": attributes(link.attributes),
            }
            for link in span.links
        ],
        "status": {
            "code": Status.StatusCode.Name(span.status.code),
            "message": span.status.message,
        },
        "resource": resource,
        "scope": scope,
    }


def spans_of(request):
    out = []
    for rs in request.resource_spans:
        resource = attributes(rs.resource.attributes)
        for ss in rs.scope_spans:
            for span in ss.spans:
                out.append(span_json(span, resource, ss.scope.name))
    return out


class Store:
    def __init__(self):
        self.lock = threading.Lock()
        self.spans = []
        self.exports = 0
        self.rejected = 0


def make_handler(store, delay_s, status):
    class Handler(BaseHTTPRequestHandler):
        # Keep-alive, as a collector does: the exporter reuses its connection.
        protocol_version = "HTTP/1.1"

        def log_message(self, format, *args):  # noqa: A002 - the base class's signature
            # Quiet: a test run or a benchmark would drown in one line per export.
            pass

        def reply(self, code, body=b"", content_type=PROTOBUF):
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def reply_json(self, value):
            self.reply(200, json.dumps(value).encode(), "application/json")

        def read_body(self):
            if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
                chunks = []
                while True:
                    size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                    if size == 0:
                        # Trailers, up to the empty line.
                        while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                            pass
                        return b"".join(chunks)
                    chunks.append(self.rfile.read(size))
                    self.rfile.readline()
            return self.rfile.read(int(self.headers.get("Content-Length") or 0))

        def do_POST(self):
            body = self.read_body()
            if self.path.split("?")[0] != "/v1/traces":
                return self.reply(404, b"", "text/plain")
            content_type = self.headers.get("Content-Type", "").split(";")[0].strip().lower()
            if content_type != PROTOBUF:
                with store.lock:
                    store.rejected += 1
                return self.reply(415, f"expected {PROTOBUF}".encode(), "text/plain")
            try:
                if self.headers.get("Content-Encoding", "").strip().lower() == "gzip":
                    body = gzip.decompress(body)
                request = ExportTraceServiceRequest.FromString(body)
                spans = spans_of(request)
            except Exception as e:  # a malformed export is the sender's bug: say so
                with store.lock:
                    store.rejected += 1
                print(f"otlp-receiver: malformed export: {e!r}", file=sys.stderr, flush=True)
                return self.reply(400, str(e).encode(), "text/plain")
            if delay_s > 0:
                time.sleep(delay_s)
            if status is not None and status != 200:
                with store.lock:
                    store.rejected += 1
                return self.reply(status, b"", "text/plain")
            with store.lock:
                store.spans.extend(spans)
                store.exports += 1
            self.reply(200, ExportTraceServiceResponse().SerializeToString())

        def do_GET(self):
            path = self.path.split("?")[0]
            with store.lock:
                if path == "/spans":
                    value = list(store.spans)
                elif path == "/stats":
                    value = {
                        "exports": store.exports,
                        "rejected": store.rejected,
                        "spans": len(store.spans),
                    }
                else:
                    value = None
            if value is None:
                return self.reply(404, b"", "text/plain")
            self.reply_json(value)

        def do_DELETE(self):
            if self.path.split("?")[0] != "/spans":
                return self.reply(404, b"", "text/plain")
            with store.lock:
                store.spans.clear()
            self.reply(204, b"", "text/plain")

    return Handler


# The sample export's identifiers, which the self-test checks against.
SAMPLE_TRACE = bytes.fromhex("0af7651916cd43dd8448eb211c80319c")
SAMPLE_POST_SPAN = bytes.fromhex("b7ad6b7169203331")
SAMPLE_ENQUEUE_SPAN = bytes.fromhex("00f067aa0ba902b7")
SAMPLE_REDELIVERY_TRACE = bytes.fromhex("4bf92f3577b34da6a3ce929d0e0e4736")
SAMPLE_DELIVER_SPAN = bytes.fromhex("53995c3f42cd8ad8")


def kv(key, value):
    if isinstance(value, bool):  # before int: a bool is an int in Python
        v = AnyValue(bool_value=value)
    elif isinstance(value, int):
        v = AnyValue(int_value=value)
    elif isinstance(value, float):
        v = AnyValue(double_value=value)
    elif isinstance(value, list):
        v = AnyValue()
        v.array_value.values.extend(kv("", x).value for x in value)
    else:
        v = AnyValue(string_value=value)
    return KeyValue(key=key, value=v)


def sample_request():
    """Two traces as summaryd would export them: a POST with its enqueue child, and a
    redelivery's deliver span, a root of its own trace linked to the POST span."""
    request = ExportTraceServiceRequest()
    rs = request.resource_spans.add()
    rs.resource.attributes.extend([kv("service.name", "summaryd")])
    ss = rs.scope_spans.add()
    ss.scope.name = "summaryd"
    t0 = 1_700_000_000_000_000_000
    common = [kv("summaryd.job_id", "job-1"), kv("summaryd.tenant", "acme")]
    post = ss.spans.add(
        trace_id=SAMPLE_TRACE,
        span_id=SAMPLE_POST_SPAN,
        trace_state="vendor=1",
        name="POST /v1/summaries",
        kind=Span.SPAN_KIND_SERVER,
        start_time_unix_nano=t0,
        end_time_unix_nano=t0 + 2_000_000,
    )
    post.attributes.extend(common + [kv("http.response.status_code", 202)])
    enqueue = ss.spans.add(
        trace_id=SAMPLE_TRACE,
        span_id=SAMPLE_ENQUEUE_SPAN,
        parent_span_id=SAMPLE_POST_SPAN,
        name="enqueue",
        kind=Span.SPAN_KIND_CLIENT,
        start_time_unix_nano=t0 + 500_000,
        end_time_unix_nano=t0 + 1_500_000,
    )
    enqueue.attributes.extend(common)
    deliver = ss.spans.add(
        trace_id=SAMPLE_REDELIVERY_TRACE,
        span_id=SAMPLE_DELIVER_SPAN,
        name="deliver",
        kind=Span.SPAN_KIND_CONSUMER,
        start_time_unix_nano=t0 + 9_000_000_000,
        end_time_unix_nano=t0 + 9_500_000_000,
    )
    deliver.attributes.extend(
        common
        + [
            kv("summaryd.deliveries", 2),
            kv("summaryd.redelivered", True),
            kv("summaryd.models", ["primary", "fallback"]),
        ]
    )
    link = deliver.links.add(trace_id=SAMPLE_TRACE, span_id=SAMPLE_POST_SPAN)
    link.attributes.extend([kv("summaryd.link", "stored context")])
    event = deliver.events.add(name="exception", time_unix_nano=t0 + 9_400_000_000)
    event.attributes.extend([kv("exception.type", "timeout")])
    deliver.status.code = Status.STATUS_CODE_ERROR
    deliver.status.message = "timeout"
    return request


def watch_stdin():
    """Exit when stdin closes: the process that started the receiver is gone (even killed
    with SIGKILL), so no receiver outlives its test."""
    while os.read(sys.stdin.fileno(), 4096):
        pass
    os._exit(0)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--delay-s", type=float, default=0.0)
    parser.add_argument("--status", type=int, default=None)
    parser.add_argument("--exit-on-stdin-eof", action="store_true")
    parser.add_argument("--print-sample", choices=["plain", "gzip"])
    args = parser.parse_args()

    if args.print_sample:
        data = sample_request().SerializeToString()
        if args.print_sample == "gzip":
            data = gzip.compress(data)
        sys.stdout.buffer.write(data)
        return

    store = Store()
    server = ThreadingHTTPServer(("127.0.0.1", args.port), make_handler(store, args.delay_s, args.status))
    # Held exports must not keep the process alive after it is told to stop.
    server.daemon_threads = True
    if args.exit_on_stdin_eof:
        threading.Thread(target=watch_stdin, daemon=True).start()
    print(f"LISTENING {server.server_address[1]}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
