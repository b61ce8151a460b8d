# The one image every ampflow pipeline step runs in (and `ampflow serve` for local tests).
# GPU base: CUDA/cuDNN matching TF 2.21; the same image runs CPU-only steps unchanged.
#   docker build -t REGISTRY/ampflow:0.1.0 .  &&  docker push REGISTRY/ampflow:0.1.0
#   ampflow compile --image REGISTRY/ampflow:0.1.0
FROM tensorflow/tensorflow:2.21.0-gpu

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    TF_CPP_MIN_LOG_LEVEL=2 \
    MPLBACKEND=Agg

# Every RUN below fails when any command of a pipe fails (hadolint DL4006).
SHELL ["/bin/bash", "-o", "pipefail", "-c"]

WORKDIR /opt/ampflow
COPY clients/python ./clients/python
COPY pyproject.toml README.md ./
COPY core ./core
COPY components ./components
COPY pipeline ./pipeline
COPY serving ./serving
COPY k8s ./k8s
# tensorflow is already in the base image at the pinned version; pip keeps it
# (tensorflow-serving-api depends on the full `tensorflow` wheel, never tensorflow-cpu).
# ampflow depends on ampflow-client, the TF-free client in clients/python (not on PyPI).
RUN python3 -m pip install --no-cache-dir ./clients/python . && python3 -m pip check

# The deploy step renders k8s/ with kubectl (kustomize built in).
ARG KUBECTL_VERSION=v1.32.4
RUN curl -fsSLo /usr/local/bin/kubectl \
      "https://dl.k8s.io/release/${KUBECTL_VERSION}/bin/linux/amd64/kubectl" \
 && echo "$(curl -fsSL "https://dl.k8s.io/release/${KUBECTL_VERSION}/bin/linux/amd64/kubectl.sha256")  /usr/local/bin/kubectl" | sha256sum -c - \
 && chmod 0755 /usr/local/bin/kubectl
ENV AMPFLOW_K8S_DIR=/opt/ampflow/k8s

# KFP runs every step as this user; the home dir is writable for TFDS and Keras caches.
RUN useradd --create-home --uid 10001 --shell /usr/sbin/nologin ampflow
USER 10001
ENV HOME=/home/ampflow TFDS_DATA_DIR=/home/ampflow/tensorflow_datasets
WORKDIR /home/ampflow

ENTRYPOINT ["ampflow"]
CMD ["--help"]
