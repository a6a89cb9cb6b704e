"""Teaches schemathesis the one request format of the API it does not know: job records as
NDJSON (`application/x-ndjson`), one JSON document per line."""

import json

import schemathesis


@schemathesis.serializer("application/x-ndjson")
def ndjson(ctx, value):
    records = value if isinstance(value, list) else [value]
    return "".join(json.dumps(record) + "\n" for record in records).encode()
