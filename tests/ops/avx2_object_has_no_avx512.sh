#!/bin/sh
# Fails when an AVX2 kernel object uses AVX-512's registers (zmm, ymm16-31, xmm16-31, masks):
# an AVX2 CPU could not run it, and FLASHMAP_ISA=avx2 on an AVX-512 machine would time a kernel
# no AVX2 CPU has. Usage: avx2_object_has_no_avx512.sh OBJDUMP OBJECT...
objdump=$1
shift
for o in "$@"; do
  n=$("$objdump" -d --no-show-raw-insn "$o" | grep -cE '%(zmm[0-9]+|[xy]mm(1[6-9]|2[0-9]|3[01])|k[1-7])\b')
  if [ "$n" != 0 ]; then
    echo "$o: $n instructions use AVX-512 registers"
    exit 1
  fi
  echo "$o: no AVX-512 registers"
done
