"""A stand-in for Grafana in the container suite, where Grafana's image cannot be pulled.

Sandbox-only (docs/deployment.md, "Settings only this sandbox needs"): it is tagged with
the image name docker-compose.yml uses, so `docker compose up` runs as written. It answers
what the suite asks of Grafana's mounts, nothing more: /api/health, and
/api/dashboards/uid/<uid> from the dashboards compose mounts at
/var/lib/grafana/dashboards (the provisioning files must be mounted too). The dashboard's
queries themselves are checked against the real Prometheus.
"""

import json
import pathlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

DASHBOARDS = pathlib.Path("/var/lib/grafana/dashboards")
PROVISIONING = pathlib.Path("/etc/grafana/provisioning")


class Handler(BaseHTTPRequestHandler):
    def _json(self, status: int, body: object) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path == "/api/health":
            provisioned = sorted(
                str(p.relative_to(PROVISIONING)) for p in PROVISIONING.rglob("*.yml")
            )
            self._json(200, {"database": "ok", "version": "stand-in", "provisioning": provisioned})
            return
        prefix = "/api/dashboards/uid/"
        if self.path.startswith(prefix):
            uid = self.path[len(prefix) :]
            for path in sorted(DASHBOARDS.glob("*.json")):
                dashboard = json.loads(path.read_text())
                if dashboard.get("uid") == uid:
                    self._json(200, {"dashboard": dashboard})
                    return
        self._json(404, {"message": "not found"})


ThreadingHTTPServer(("0.0.0.0", 3000), Handler).serve_forever()
