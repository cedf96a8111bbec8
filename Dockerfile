# The specguard image the Kubernetes manifests and the compose stack run (docs/deploy.md, "The image"):
#   docker build -t ghcr.io/specguard/specguard:0.1.0 .
# Non-root (uid 10001, as the manifests' runAsUser), nothing written outside the mounted volumes,
# so it runs with a read-only root filesystem.
FROM python:3.11-slim
WORKDIR /src
COPY pyproject.toml README.md ./
COPY specguard ./specguard
RUN pip install --no-cache-dir . && useradd --uid 10001 --no-create-home specguard
USER 10001
ENTRYPOINT ["specguard"]
