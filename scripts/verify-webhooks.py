"""Verify webhook requests with the Standard Webhooks reference library (PyPI
`standardwebhooks`), not with summaryd's own signing code, so the tests check what a real
receiver would accept.

Reads JSON lines on stdin, one request each:

    {"secret": "whsec_...", "headers": {"webhook-id": "...", ...}, "body": "<raw body>"}

and prints one JSON line per input line, in order:

    {"ok": true, "payload": <the JSON body, as the library returns it>}
    {"ok": false, "error": "<exception class>: <message>"}

A line that cannot be read (not JSON, a field missing or of the wrong type, a secret the
library refuses) is reported as not ok; the script goes on with the next line. Run it
through scripts/verify-webhooks.sh, which provides the pinned library.
"""

import json
import sys

from standardwebhooks.webhooks import Webhook


def verify(raw: bytes) -> dict:
    try:
        request = json.loads(raw.decode("utf-8"))
        if not isinstance(request, dict):
            raise TypeError("a line must be a JSON object, not " + type(request).__name__)
        secret = request["secret"]
        headers = request["headers"]
        body = request["body"]
        if not isinstance(secret, str):
            raise TypeError('"secret" must be a string')
        if not isinstance(body, str):
            raise TypeError('"body" must be a string')
        if not isinstance(headers, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in headers.items()
        ):
            raise TypeError('"headers" must be an object of strings')
        payload = Webhook(secret).verify(body, headers)
        return {"ok": True, "payload": payload}
    except Exception as e:  # every failure is an answer, never the end of the run
        return {"ok": False, "error": f"{type(e).__name__}: {e}"}


def main() -> None:
    out = sys.stdout
    for line in sys.stdin.buffer:
        out.write(json.dumps(verify(line.rstrip(b"\r\n"))) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
