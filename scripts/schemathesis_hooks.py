"""Schemathesis hooks for summaryd (loaded through SCHEMATHESIS_HOOKS by
scripts/schemathesis.sh).

An Idempotency-Key is unique per logical request; a schema cannot say so, and a generator
that reuses a valid key with another body gets the documented 422 (key reused), which
schemathesis would count as a valid request rejected. So every *valid* key it generates is
replaced by a fresh one, as a well-behaved client does; invalid keys stay as generated, so
the negative cases (too short, too long, invisible characters) are still sent.
"""

import re
import uuid

import schemathesis

VALID_KEY = re.compile(r"^[!-~]{16,128}$")


@schemathesis.hook
def before_call(ctx, case, kwargs):
    # Runs before every request of every phase (coverage included, which map_* skip).
    headers = case.headers
    if headers and VALID_KEY.match(str(headers.get("Idempotency-Key", ""))):
        headers["Idempotency-Key"] = "fuzz-" + uuid.uuid4().hex
