#!/usr/bin/env bash
# special_files.sh CASE FLASHMAP SOURCE_DIR: a model or tokenizer folder in which one file is a
# FIFO, a directory or a device instead of a regular file. Each must be refused at once with
# "NAME: not a regular file (KIND)" and exit status 1: opening a FIFO blocks until a writer
# comes (never), a device reads forever. `timeout` turns a regression into a failure, not a hang.
set -u
case_=$1 flashmap=$2 src=$3
here=$(cd "$(dirname "$0")" && pwd)
fx=$src/tests/fixtures/tiny-a
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
expect() { "$here/../cli/expect_error.sh" "$1" timeout 30 "${@:2}"; }
gen=("$flashmap" generate --prompt-ids 1,2 --max-new-tokens 2)
case $case_ in
  fifo_weights)  # the weights of the target
    cp "$fx/target/config.json" "$tmp/" && mkfifo "$tmp/model.safetensors"
    expect "$tmp/model.safetensors: not a regular file \(a FIFO\)" "${gen[@]}" --target "$tmp" --no-draft
    ;;
  fifo_draft_weights)  # the weights of the drafter
    cp "$fx/draft/config.json" "$tmp/" && mkfifo "$tmp/model.safetensors"
    expect "$tmp/model.safetensors: not a regular file \(a FIFO\)" "${gen[@]}" --target "$fx/target" --draft "$tmp"
    ;;
  fifo_shard)  # one shard of a sharded checkpoint
    cp "$fx"/target_sharded/* "$tmp/" && rm "$tmp/model-00003-of-00006.safetensors" &&
      mkfifo "$tmp/model-00003-of-00006.safetensors"
    expect "$tmp/model-00003-of-00006.safetensors: not a regular file \(a FIFO\)" "${gen[@]}" --target "$tmp" --no-draft
    ;;
  fifo_index)  # model.safetensors.index.json
    cp "$fx/target/config.json" "$tmp/" && mkfifo "$tmp/model.safetensors.index.json"
    expect "$tmp/model.safetensors.index.json: not a regular file \(a FIFO\)" "${gen[@]}" --target "$tmp" --no-draft
    ;;
  fifo_config)  # config.json
    mkfifo "$tmp/config.json"
    expect "$tmp/config.json: not a regular file \(a FIFO\)" "${gen[@]}" --target "$tmp" --no-draft
    ;;
  fifo_generation_config)  # generation_config.json (read for the default stop ids)
    cp "$fx"/target/*.json "$fx/target/model.safetensors" "$tmp/" && rm "$tmp/generation_config.json" &&
      mkfifo "$tmp/generation_config.json"
    expect "$tmp/generation_config.json: not a regular file \(a FIFO\)" "${gen[@]}" --target "$tmp" --no-draft
    ;;
  directory_weights)  # a directory named model.safetensors
    cp "$fx/target/config.json" "$tmp/" && mkdir "$tmp/model.safetensors"
    expect "$tmp/model.safetensors: not a regular file \(a directory\)" "${gen[@]}" --target "$tmp" --no-draft
    ;;
  device_tokenizer)  # tokenizer.json -> /dev/zero (reads forever)
    ln -s /dev/zero "$tmp/tokenizer.json"
    expect "$tmp/tokenizer.json: not a regular file \(a character device\)" "$flashmap" tokenize --tokenizer "$tmp" --text hi
    ;;
  fifo_chat_template)  # chat_template.jinja of a tokenizer folder
    cp "$src/tests/data/chat/qwen3/tokenizer_config.json" "$tmp/" && mkfifo "$tmp/chat_template.jinja"
    expect "$tmp/chat_template.jinja: not a regular file \(a FIFO\)" "$flashmap" render --tokenizer "$tmp" --request "$src/tests/data/chat/requests/empty_content.json"
    ;;
  fifo_tokenizer_config)  # tokenizer_config.json of a tokenizer folder
    mkfifo "$tmp/tokenizer_config.json"
    expect "$tmp/tokenizer_config.json: not a regular file \(a FIFO\)" "$flashmap" render --tokenizer "$tmp" --request "$src/tests/data/chat/requests/empty_content.json"
    ;;
  *)
    echo "unknown case $case_"
    exit 1
    ;;
esac
