# Operator: `rimuru operator` (kopf). Slim: no torch.
#   docker build -f helm/images/operator.Dockerfile -t ghcr.io/rimuru-dev/rimuru-operator:0.1.0 .
# Extra: operator (kopf, kubernetes-asyncio); the base install brings grpcio for the
# control-plane client.

FROM python:3.11-slim-bookworm AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY rimuru rimuru
COPY protos protos
COPY dataplane dataplane
COPY controlplane controlplane
COPY kernels kernels
COPY operator operator
RUN pip wheel --no-cache-dir --wheel-dir /wheels ".[operator]"

FROM python:3.11-slim-bookworm
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir --no-index --find-links /wheels "rimuru[operator]" \
    && rm -rf /wheels \
    && useradd --uid 10001 --user-group --no-create-home --home-dir /tmp rimuru
USER 10001:10001
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
EXPOSE 8080
ENTRYPOINT ["rimuru"]
CMD ["operator", "--all-namespaces"]
