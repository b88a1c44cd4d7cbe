"""The floor: the least any extender written in Python under gunicorn could do.

A bare WSGI app, served by gunicorn with ks-scheduler's own config, that reads the
body, parses it with orjson, looks each node up in a dict and writes the answer.
No framework, no validation, no database. The benchmark runs it beside the real
server and reports every figure as a ratio to it.
"""

import orjson

from tools.bench.data import KEYNODE_ROWS, NODE_COUNT, PIPELINE_LABEL, keynode_rows


def _scores() -> dict[str, int]:
    """A score per node for the benchmark label, computed once at import."""
    keys = PIPELINE_LABEL.split("-")
    positions = {key: index for index, key in enumerate(keys)}
    best: dict[str, int] = {}
    for key, node, count in keynode_rows(KEYNODE_ROWS, NODE_COUNT):
        index = positions.get(key)
        if index is not None:
            score = min(10, int((index + 1) * 10 / len(keys) + count // 10))
            best[node] = max(best.get(node, 0), score)
    return best


SCORES = _scores()


def application(environ, start_response):
    length = int(environ.get("CONTENT_LENGTH") or 0)
    args = orjson.loads(environ["wsgi.input"].read(length))
    if environ["PATH_INFO"].endswith("/alwaystrue"):
        answer = {
            "Nodes": args["Nodes"],
            "NodeNames": args["NodeNames"],
            "FailedNodes": {},
            "FailedAndUnresolvableNodes": {},
            "Error": "",
        }
    else:
        names = args["NodeNames"]
        if names is None:
            names = [item["metadata"]["name"] for item in args["Nodes"]["items"]]
        answer = [{"Host": name, "Score": SCORES.get(name, 1)} for name in names]
    body = orjson.dumps(answer)
    start_response(
        "200 OK",
        [("Content-Type", "application/json"), ("Content-Length", str(len(body)))],
    )
    return [body]
