"""A TLS server answering every GET with 'ok': tls_server.py PORT CERT KEY."""

import http.server
import ssl
import sys


class Ok(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"ok\n")


port, cert, key = int(sys.argv[1]), sys.argv[2], sys.argv[3]
server = http.server.HTTPServer(("", port), Ok)
context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
context.load_cert_chain(cert, key)
server.socket = context.wrap_socket(server.socket, server_side=True)
server.serve_forever()
