"""The S3-compatible server of the tests: moto's S3 service alone.

`moto_server` serves every AWS service and, for each request, works out which one it
is for by scanning moto's package folders; it also answers HTTP/1.0, so every request
opens a connection and a thread. Serving the S3 app directly, with keep-alive and
without a log line per request, answers the same requests about twice as fast.

    python s3_server.py HOST PORT
"""

import logging
import sys

from moto.moto_server.werkzeug_app import MotoRequestHandler, create_backend_app
from werkzeug.serving import run_simple


class KeepAlive(MotoRequestHandler):
    protocol_version = "HTTP/1.1"


def main():
    host, port = sys.argv[1], int(sys.argv[2])
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    print(f"S3 (moto) on http://{host}:{port}", flush=True)
    run_simple(host, port, create_backend_app("s3"), threaded=True, request_handler=KeepAlive)


if __name__ == "__main__":
    main()
