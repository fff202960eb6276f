# Data plane: `rimuru serve` on a GPU (CUDA + torch + Triton).
#   docker build -f helm/images/dataplane.Dockerfile -t ghcr.io/rimuru-dev/rimuru-dataplane:0.1.0 .
# The PyPI torch wheel brings its own CUDA runtime libraries; the node's NVIDIA driver
# comes in through the NVIDIA container toolkit. Extras: engine, kernels, serve.

FROM python:3.11-slim-bookworm AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY rimuru rimuru
COPY protos protos
COPY dataplane dataplane
COPY controlplane controlplane
COPY kernels kernels
COPY operator operator
RUN pip wheel --no-cache-dir --wheel-dir /wheels ".[engine,kernels,serve]"

FROM python:3.11-slim-bookworm
# Triton compiles a small C launcher per kernel at run time: it needs a C compiler.
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir --no-index --find-links /wheels "rimuru[engine,kernels,serve]" \
    && rm -rf /wheels
# The pods run read-only as this user; caches go to the /tmp emptyDir the operator mounts.
RUN useradd --uid 10001 --user-group --no-create-home --home-dir /tmp rimuru
USER 10001:10001
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 HOME=/tmp TRITON_CACHE_DIR=/tmp/triton
EXPOSE 50051 9464
ENTRYPOINT ["rimuru"]
CMD ["serve"]
