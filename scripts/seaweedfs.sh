#!/usr/bin/env bash
# Ensure .tools/bin/weed: the SeaweedFS server the tests run as their S3 store (file attachments).
# SeaweedFS because it is Apache-2.0 and its S3 gateway checks SigV4 signatures, presigned URLs'
# expiry and presigned POST policies (content-length-range included); the MinIO server is AGPL,
# and Ceph's radosgw needs a whole cluster. Debian does not package it: it is built from its Go
# module once, in a few minutes (scripts/go-program.sh; the Go toolchain is fetched from the Go
# module proxy when the machine has no recent enough go: scripts/go-toolchain.sh).
set -euo pipefail
# A pseudo-version: SeaweedFS 4.53 (its go.mod wants go >= 1.26.6).
exec bash "$(dirname "$0")/go-program.sh" weed github.com/seaweedfs/seaweedfs \
  v0.0.0-20261109003541-7506e5f91cd6 ./weed
