#!/usr/bin/env python3
"""Generate the tokenizer test corpus and its golden ids from Hugging Face `tokenizers`.

    pip install tokenizers          # goldens in the repo were made with tokenizers 0.23.3
    python3 tools/make_tokenizer_goldens.py

Writes (deterministic for a given `tokenizers` version):
  tests/data/tokenizer_corpus.jsonl   one JSON string per line: the adversarial corpus
  tests/data/tokenizer_golden.jsonl   one JSON object per line, by "kind":
    "encode"     {"i": line, "ids": [...], "decoded": str?, "nfc": str?}
                 ids = HF Qwen3 encode(add_special_tokens=False) of corpus line i; "decoded" is
                 HF decode(ids) and "nfc" HF's NFC normalizer output, each only when they differ
                 from the line
    "decode"     {"ids": [...], "skip_special": bool, "text": str}   HF Qwen3 decode
    "tokenizer"  {"name": str, "json": {...}}   a small tokenizer.json trained here with HF
    "tiny"       {"name": str, "i": line, "ids": [...]}   HF ids of corpus line i with it
    "tiny_decode" {"name": str, "ids": [...], "skip_special": bool, "text": str}

Every expected value comes from HF; nothing is produced by flashmap.
"""

import copy
import json
import os
import random
import sys
import unicodedata

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers
from tokenizers import pre_tokenizers

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QWEN = os.path.join(ROOT, "tests/data/qwen3-tokenizer/tokenizer.json")
CORPUS = os.path.join(ROOT, "tests/data/tokenizer_corpus.jsonl")
GOLDEN = os.path.join(ROOT, "tests/data/tokenizer_golden.jsonl")
SEED = 20250607

rng = random.Random(SEED)

# ---------------------------------------------------------------------------------------------
# Building blocks

PROSE = [
    "The quick brown fox jumps over the lazy dog. It wasn't the first time, and it won't be the last.",
    "Speculative decoding lets a small drafter propose several tokens that the large model checks in "
    "one pass; when the guesses are right, we get more tokens per forward pass for free.",
    "She said, \"I'll be there at 10:30 a.m. on the 3rd of May, 2024 -- don't be late!\"",
    "In 1969, 600 million people watched Apollo 11 land; the crew's descent took 12.5 minutes.",
    "WE'RE NOT SHOUTING, WE'VE JUST GOT CAPS LOCK ON. THEY'D SAY IT'S FINE, YOU'LL SEE, I'M SURE.",
    "Prices rose 3.7% year-over-year (vs. 2.9% expected), according to the Bureau's Q3 report.",
    "Mr. O'Neil's dog -- a 7-year-old retriever named \"Biscuit\" -- ran 4.2 km/h faster than before.",
    "e-mail me at someone@example.com or visit https://example.org/path?query=1&x=2#frag today.",
    "Tokenizers split text into pieces; each piece becomes one or more ids via byte-pair merges.",
    "Hyphenated-words, under_scores, camelCaseIdentifiers and SCREAMING_SNAKE_CASE all appear in code.",
]

FOREIGN = [
    "Le cœur a ses raisons que la raison ne connaît point. Ça m'étonnerait qu'il vienne à Noël.",
    "Über den Wolken muss die Freiheit wohl grenzenlos sein; Straße, Fußgänger, Äpfel und Öl.",
    "El niño comió piñas y jalapeños en la mañana; ¿dónde está el baño? ¡Olé!",
    "Съешь же ещё этих мягких французских булок, да выпей чаю. Москва — столица России.",
    "Ξεσκεπάζω την ψυχοφθόρα βδελυγμία. Η γλώσσα μου έδωσαν ελληνική.",
    "العربية لغة جميلة، وهي من أكثر اللغات انتشاراً في العالم. ١٢٣٤٥٦٧٨٩٠",
    "עברית היא שפה שמית; השמש זורחת בבוקר. 2024 שנה טובה!",
    "हिन्दी भारत की एक प्रमुख भाषा है। संख्या: ०१२३४५६७८९",
    "我们在测试分词器：中文没有空格，所以每个字都可能单独成为一个词。二〇二四年。",
    "日本語のテキストには、ひらがな・カタカナ・漢字が混在します。ｶﾀｶﾅ（半角）も。",
    "한국어 문장은 띄어쓰기가 있습니다. 안녕하세요, 반갑습니다! 한글 자모: ㄱㄴㄷ",
    "ภาษาไทยไม่มีการเว้นวรรคระหว่างคำ สวัสดีครับ ๑๒๓",
    "Tiếng Việt có nhiều dấu: Nguyễn, Trường, Hà Nội, phở bò, người Việt.",
    "Türkçe: ığdır, İstanbul, şeker, çocuk, ğ; Polski: zażółć gęślą jaźń.",
    "ქართული ენა; Հայերեն լեզու; ᎠᏍᎦᏯ (Cherokee); ᐃᓄᒃᑎᑐᑦ (Inuktitut).",
]

CODE = [
    'def fib(n: int) -> int:\n    """Return the n-th Fibonacci number."""\n    a, b = 0, 1\n'
    "    for _ in range(n):\n        a, b = b, a + b\n    return a\n\n\nprint(fib(30))  # 832040\n",
    "#include <vector>\n\ntemplate <typename T>\nT sum(const std::vector<T>& v) {\n\tT s{};\n"
    "\tfor (const auto& x : v) s += x;\n\treturn s;\n}\n\nint main() { return sum<int>({1, 2, 3}) != 6; }\n",
    '{\n  "name": "flashmap",\n  "version": "0.1.0",\n  "tags": ["llm", "speculative"],\n'
    '  "nested": {"a": [1, 2.5, -3e10, null, true, false]}\n}\n',
    "<!DOCTYPE html>\n<html lang=\"en\">\n  <body>\n    <div class='x'>&amp; &lt;tag&gt; &#x1F600;</div>\n"
    "  </body>\n</html>\n",
    "#!/usr/bin/env bash\nset -euo pipefail\nfor f in *.txt; do\n  wc -l \"$f\" | awk '{print $1}'\n"
    "done 2>/dev/null || echo \"failed: $?\" >&2\n",
    "SELECT u.id, COUNT(*) AS n\nFROM users u\nJOIN orders o ON o.user_id = u.id\n"
    "WHERE o.created_at >= '2024-01-01'\nGROUP BY u.id\nHAVING n > 10\nORDER BY n DESC;\n",
    "fn main() {\n    let v: Vec<u32> = (0..10).map(|x| x * x).collect();\n"
    "    println!(\"{:?} {}\", v, v.iter().sum::<u32>());\n}\n",
    "    if (x != y && !z || a <= b >= c) {{ return x->y.z[0] << 2 >> 1 ^ ~0u; }}\r\n",
    "// TODO(someone): fix this\n/* multi\n   line */\nconst re = /^(?:[a-z0-9._%+-]+)@(?:[a-z0-9-]+\\.)+[a-z]{2,}$/i;\n",
    "x = [i**2 for i in range(10) if i % 2 == 0]\t# tabs\tand\t\tdouble tabs\n\t\t\tindented\n",
    "diff --git a/f b/f\n--- a/f\n+++ b/f\n@@ -1,3 +1,3 @@\n-old line\n+new line\n context\n",
]

SPECIAL_WORDS = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
    "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>",
    "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
    "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>", "<think>", "</think>",
]
NEAR_SPECIAL = [
    "<|im_start", "im_start|>", "<|im_end |>", "< think>", "<think", "</think >", "<|endoftext|",
    "<<|im_end|>>", "<|<|im_start|>|>", "<|IM_START|>", "<Think>", "<|", "|>", "<>", "</>",
]

WORDS = (
    "the of and to in is that it for was on are as with his they at be this from have or by one "
    "had not but what all were when we there can an your which their said if do will each about "
    "how up out them then she many some so these would other into has more her two like him see "
    "time could no make than first been its who now people my made over did down only way find "
    "use may water long little very after words called just where most know get through back "
    "Token tokenizer BPE merges vocabulary GPU kernel latency throughput drafter verifier"
).split()

APOSTROPHES = ["'", "\u2019", "\u2018", "`", "\u02bc", "''"]
CONTRACTIONS = ["s", "t", "re", "ve", "m", "ll", "d"]

WS_CHARS = [" ", " ", " ", "\t", "\n", "\n", "\r\n", "\r", "\u00a0", "\u3000", "\u2028", "\u2029",
            "\x0b", "\x0c", "\u0085", "\u180e", "\u200b", "\u2009", "\u202f", "\u1680", "\ufeff"]

COMBINING = [chr(c) for c in range(0x300, 0x370)] + [chr(c) for c in range(0x1AB0, 0x1ACF)] + \
    [chr(c) for c in range(0x1DC0, 0x1E00)] + [chr(c) for c in range(0x20D0, 0x20F1)] + \
    [chr(c) for c in range(0xFE20, 0xFE30)] + ["\u0898", "\u089c", "\u08ca", "\u08d3", "\u0c3c",
                                                "\u0d3b", "\u0eba", "\u1715", "\u07fd", "\ua82c"]

EMOJI = [
    "😀", "😂", "🥲", "🤖", "🔥", "✨", "❤️", "❤", "☺️", "👍", "👍🏻", "👍🏽", "👍🏿", "👋🏼",
    "👨‍👩‍👧‍👦", "👩‍❤️‍💋‍👨", "🧑🏾‍🚀", "👩🏻‍💻", "🏳️‍🌈", "🏴‍☠️", "🇺🇸", "🇯🇵", "🇪🇺", "1️⃣", "#️⃣",
    "🏴󠁧󠁢󠁳󠁣󠁴󠁿", "🫶🏽", "🧔‍♂️", "🐕‍🦺", "👁️‍🗨️", "🤷‍♀️", "©️", "™", "🀄", "🃏", "🂡", "🪿", "🫎",
]


def pick(seq):
    return seq[rng.randrange(len(seq))]


def assigned(cp):
    if 0xD800 <= cp < 0xE000:
        return False
    return unicodedata.category(chr(cp)) != "Cn" or cp in LATE_LETTERS or cp in LATE_NUMBERS


def onig_class(pattern, candidates):
    """Code points HF's Oniguruma puts in `pattern` (e.g. \\p{L}), among `candidates`."""
    split = pre_tokenizers.Split(Regex(pattern), "removed")
    text = "".join(chr(c) for c in candidates)
    kept = set()
    for piece, _ in split.pre_tokenize_str(text):
        kept.update(ord(ch) for ch in piece)
    return {c for c in candidates if c not in kept}


# Letters and numbers newer than Python's Unicode tables, as HF's regex engine knows them.
_unknown = [c for c in range(0x80, 0x40000)
            if not (0xD800 <= c < 0xE000) and unicodedata.category(chr(c)) == "Cn"]
LATE_LETTERS = onig_class(r"\p{L}", _unknown)
LATE_NUMBERS = onig_class(r"\p{N}", _unknown)


def words(n, cap=0.1):
    out = []
    for _ in range(n):
        w = pick(WORDS)
        r = rng.random()
        if r < cap:
            w = w.capitalize()
        elif r < cap * 1.3:
            w = w.upper()
        out.append(w)
    return out


# ---------------------------------------------------------------------------------------------
# Corpus sections

def sec_edge():
    lines = ["", " ", "  ", "\n", "\r\n", "\t", "a", "A", "0", "'", "''", "'s", " 's", "\x00",
             "\x00\x01\x02\x1f\x7f", "\ufeff", "\ufeffBOM", "\ufffd", "\uffff\ufffe", "\U0010ffff",
             "\U000e0001\U000e0041", "\ue000\uf8ff\U000f0000\U00100000", "\u200d", "\u200c\u200d",
             "Ġ", "Ċ", "ĠĠ", "âĢ", "Ã©", "\u0100\u0120\u0143\u0144", "<", ">", "|", "<||>"]
    lines += [chr(b) for b in range(0x20, 0x7f)]
    lines += ["".join(chr(b) for b in range(0x20, 0x7f)), "".join(chr(c) for c in range(0xa0, 0x180))]
    return lines


def sec_whitespace(n):
    lines = []
    for _ in range(n):
        parts = []
        for _ in range(rng.randint(1, 12)):
            r = rng.random()
            if r < 0.5:
                parts.append("".join(pick(WS_CHARS) for _ in range(rng.randint(1, 9))))
            elif r < 0.6:
                parts.append(pick([" ", "\t", "\n", "\r\n"]) * rng.randint(2, 40))
            elif r < 0.8:
                parts.append(pick(WORDS))
            elif r < 0.9:
                parts.append(pick(["!", "?", "...", ",", "-", "//", "#", ")", "("]))
            else:
                parts.append(str(rng.randint(0, 10**rng.randint(1, 6))))
        lines.append("".join(parts))
    # Fixed shapes: leading/trailing runs, run before a word, lone CRs, mixed line endings.
    for ws in [" ", "\t", "\n", "\r\n", " \n", "\n ", " \t ", "\u00a0", "\u3000", "\r"]:
        for k in [1, 2, 3, 7]:
            lines.append(ws * k + "word" + ws * k)
            lines.append("a" + ws * k + "b")
            lines.append(ws * k + "!" + ws * k + "1" + ws * k)
            lines.append("x" + ws * k)
    return lines


def sec_apostrophes(n):
    lines = []
    for c in CONTRACTIONS:
        forms = [c, c.upper(), c.capitalize(), c[::-1], c[:-1] + c[-1].upper()]
        for form in dict.fromkeys(forms):  # ordered: the corpus must not depend on hash seeds
            for ap in APOSTROPHES:
                lines.append(f"it{ap}{form} {ap}{form} x{ap}{form}y {ap}{form}{ap}{form}")
                lines.append(f"  {ap}{form}\n{ap}{form}")
    lines += ["it'ſ", "'ſ", "'ſt", "'K", "'\u212a", "don't", "DON'T", "y'all'd've", "'''s'''",
              "rock 'n' roll", "'tis", "o'clock", "ma'am", "'Sup", "''ll", "'  s", "' s", "1's",
              "It’s", "IT’S", "we’ll", "’90s", "‘quoted’", "“double”"]
    for _ in range(n):
        w = words(rng.randint(1, 6))
        out = []
        for x in w:
            out.append(x)
            if rng.random() < 0.6:
                c = pick(CONTRACTIONS)
                c = c.upper() if rng.random() < 0.3 else c
                out[-1] += pick(APOSTROPHES) + c
        lines.append(" ".join(out))
    return lines


def sec_digits(n):
    lines = []
    for k in [1, 2, 3, 4, 5, 10, 17, 64, 200, 1000]:
        lines.append("".join(str(rng.randint(0, 9)) for _ in range(k)))
    for _ in range(n):
        r = rng.random()
        if r < 0.3:
            lines.append(f"{rng.randint(0, 10**12)}.{rng.randint(0, 10**6)}e-{rng.randint(0, 99)}")
        elif r < 0.5:
            lines.append(" ".join(str(rng.randint(0, 10**rng.randint(1, 20))) for _ in range(5)))
        elif r < 0.7:
            lines.append(f"v{rng.randint(0,9)}.{rng.randint(0,99)}.{rng.randint(0,999)}-rc{rng.randint(1,9)} "
                         f"0x{rng.randint(0, 2**32):08X} 1,234,567 +1 (555) 010-{rng.randint(0,9999):04d}")
        else:
            # Digits from other scripts and number-like symbols.
            digs = "٠١٢٣٤٥٦٧٨٩۰۱۲०१२৩৪੫૬୭௮౯೦൧๒໓༤၅០᠑１２３𝟘𝟙𝟚²³¹⁴₀₁½⅓¼ⅠⅡⅫⅿ〇〡〢𑁦𐒠"
            lines.append("".join(pick(digs) if rng.random() < 0.5 else str(rng.randint(0, 9))
                                 for _ in range(rng.randint(3, 30))))
    return lines


def sec_unicode_blocks():
    """Characters sampled from every 128-code-point block of planes 0-3 and 14."""
    lines = []
    cur = []
    ranges = [(0, 0x40000), (0xE0000, 0xE0200), (0xF0000, 0xF0100), (0x10FF00, 0x110000)]
    for lo, hi in ranges:
        for block in range(lo, hi, 128):
            cps = [c for c in range(block, block + 128) if assigned(c)]
            if not cps:
                continue
            sample = rng.sample(cps, min(len(cps), 6))
            seg = []
            for c in sample:
                seg.append(chr(c))
                r = rng.random()
                if r < 0.2:
                    seg.append(" ")
                elif r < 0.3:
                    seg.append(pick(["a", "Z", "1", ".", "'s", "\n", "  "]))
            cur.append("".join(seg))
            if len(cur) == 12:
                lines.append(pick(["", " ", "x"]).join(cur))
                cur = []
    if cur:
        lines.append(" ".join(cur))
    # Per general category, across the whole code space.
    by_cat = {}
    for c in range(0x20, 0x40000):
        if assigned(c):
            by_cat.setdefault(unicodedata.category(chr(c)), []).append(c)
    for cat in sorted(by_cat):
        cps = by_cat[cat]
        for _ in range(3):
            s = "".join(chr(pick(cps)) for _ in range(rng.randint(4, 24)))
            lines.append(s)
            lines.append("a" + s + " b " + s[: len(s) // 2] + "1")
    late = sorted(LATE_LETTERS | LATE_NUMBERS)
    for _ in range(12):
        lines.append(" ".join("".join(chr(pick(late)) for _ in range(rng.randint(1, 5)))
                              for _ in range(rng.randint(2, 8))))
    return lines


def sec_cjk(n):
    pools = [(0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x3040, 0x309F),
             (0x30A0, 0x30FF), (0xAC00, 0xD7A3), (0xFF61, 0xFF9F), (0x2F800, 0x2FA1D)]
    punct = "。、「」『』（）！？：；・〜…—《》【】·，"
    lines = []
    for _ in range(n):
        out = []
        for _ in range(rng.randint(5, 60)):
            r = rng.random()
            if r < 0.8:
                lo, hi = pick(pools)
                out.append(chr(rng.randint(lo, hi)))
            elif r < 0.93:
                out.append(pick(punct))
            else:
                out.append(pick([" ", "\n", "AI", "GPU", "2024", "Qwen3"]))
        lines.append("".join(out))
    # Conjoining jamo that NFC composes into syllables, and compatibility jamo that it leaves.
    for _ in range(20):
        s = ""
        for _ in range(rng.randint(1, 6)):
            s += chr(0x1100 + rng.randint(0, 18)) + chr(0x1161 + rng.randint(0, 20))
            if rng.random() < 0.5:
                s += chr(0x11A8 + rng.randint(0, 26))
            if rng.random() < 0.2:
                s += " "
        lines.append(s)
    lines.append("\u1100\u1161\u11a8 \uac00\u11a8 \u3131\u314f \u1100\u0301\u1161")
    return lines


def sec_emoji(n):
    lines = ["".join(EMOJI), " ".join(EMOJI)]
    for _ in range(n):
        out = []
        for _ in range(rng.randint(1, 12)):
            r = rng.random()
            if r < 0.5:
                out.append(pick(EMOJI))
            elif r < 0.6:
                out.append(chr(rng.randint(0x1F300, 0x1FAFF)) + pick(["", "\ufe0f", "\ufe0e", "\u200d"]))
            elif r < 0.7:
                out.append(chr(rng.randint(0x1F1E6, 0x1F1FF)))
            else:
                out.append(pick([" ", "  ", "wow", "!", "\n", "ok", "👍"]))
        lines.append("".join(out))
    return lines


def sec_combining(n):
    lines = [
        "e\u0301 e\u0301\u0301 \u00e9 E\u0301 a\u030a \u00c5 \u212b \u2126 \u03a9 K \u212a",
        "\u1e9b\u0323 \u0071\u0307\u0323 \u0071\u0323\u0307 \u1e0b\u0323 \u1e0d\u0307 e\u0323\u0302 \u1ec7",
        "\u0958 \u0915\u093c \u09dc \u0b47\u0b3e \u0b4b \u0dd9\u0dcf \u1025\u102e \u0cc6\u0cd5",
        "\u0340\u0341\u0343\u0344 \u0374 \u037e \u0387 \u1f71 \u2000 \u2001 \u2329 \u232a",
        "\u0301 leading mark, \u0301\u0301 two marks, a\u0345\u0301, a\u0301\u0345",
        "q\u1df6\u0301 q\u0301\u1df6 a\u1dfa\u0301 a\u0301\u1dfa e\u0898\u0301 e\u0316\u0898\u0301",
        "\u0915\u094d\u200d\u0937 \u0924\u094d\u200c\u0924 \u0622 \u0627\u0653 \u0623 \u0627\u0654",
        "\ufb01 \ufb2a \ufb2b \u05e9\u05c1 \u05e9\u05bc\u05c1 \u2e9f \u2f00 \u3099 \u304b\u3099 \u304c",
    ]
    bases = "aeiouyAEIOUYnNcCsSzZgGkKlLrRwWqx\u03b1\u03b5\u03b7\u03b9\u03bf\u03c5\u03c9\u0430\u0435\u0438\u043e" \
            "\u0443\u0627\u05d0\u0915\u0e01 1.'"
    for _ in range(n):
        out = []
        for _ in range(rng.randint(1, 15)):
            out.append(pick(bases))
            for _ in range(rng.choice([0, 1, 1, 2, 3, 5])):
                out.append(pick(COMBINING))
            if rng.random() < 0.2:
                out.append(" ")
        lines.append("".join(out))
    # Precomposed letters decomposed (NFD) so that NFC must put them back together.
    for _ in range(n // 2):
        s = "".join(chr(rng.randint(0xC0, 0x24F)) for _ in range(rng.randint(3, 20)))
        s += " " + "".join(chr(rng.randint(0x1E00, 0x1EFF)) for _ in range(rng.randint(3, 12)))
        lines.append(unicodedata.normalize("NFD", s))
        lines.append(unicodedata.normalize("NFKD", s) + " " + s)
    return lines


def sec_special(n):
    lines = []
    for w in SPECIAL_WORDS:
        lines += [w, " " + w, w + " ", " " + w + " ", "a" + w + "b", "\n" + w + "\n", w + w,
                  "  " + w + "  x", w + "'s", "1" + w + "2"]
    lines += NEAR_SPECIAL
    lines.append("".join(SPECIAL_WORDS))
    lines.append("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
                 "What's 2+2?<|im_end|>\n<|im_start|>assistant\n<think>\nSimple.\n</think>\n\n4<|im_end|>")
    lines.append("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Zürich\"}}\n</tool_call>")
    for _ in range(n):
        out = []
        for _ in range(rng.randint(2, 10)):
            r = rng.random()
            if r < 0.35:
                out.append(pick(SPECIAL_WORDS))
            elif r < 0.45:
                out.append(pick(NEAR_SPECIAL))
            elif r < 0.75:
                out.append(" ".join(words(rng.randint(1, 4))))
            else:
                out.append(pick([" ", "\n", "  ", "\n\n", "\t", "e\u0301", "\u0301"]))
        lines.append("".join(out))
    return lines


def sec_prose(n):
    lines = list(PROSE) + list(FOREIGN)
    for _ in range(n):
        k = rng.randint(1, 4)
        lines.append(" ".join(pick(PROSE + FOREIGN) for _ in range(k)))
    for _ in range(n):
        sent = " ".join(words(rng.randint(3, 30)))
        lines.append(sent[0].upper() + sent[1:] + pick([".", "!", "?", "...", ""]))
    return lines


def sec_code(n):
    lines = list(CODE)
    for _ in range(n):
        s = pick(CODE)
        if rng.random() < 0.5:
            s = s.replace("    ", "\t")
        if rng.random() < 0.3:
            s = s.replace("\n", "\r\n")
        if rng.random() < 0.3:
            s = "    " * rng.randint(1, 4) + s
        lines.append(s)
    lines += ["=" * 3000, "-" * 257 + ">", "#" * 80 + "\n" + "#" * 80, "." * 1000,
              "a" * 5000, "ab" * 2000, "Abc" * 700, " " * 20000, "\n" * 3000, "\t" * 500,
              " \n" * 400, "😀" * 300, "中" * 2000, "\u0301" * 300, "e\u0301" * 500,
              "🇺🇸" * 200, "🏴󠁧󠁢󠁳󠁣󠁴󠁿" * 50, "'s" * 500, "0123456789" * 300]
    return lines


def sec_fuzz(n):
    lines = []
    for _ in range(n):
        out = []
        for _ in range(rng.randint(1, 40)):
            r = rng.random()
            if r < 0.4:
                c = rng.randint(0x20, 0x7E)
            elif r < 0.6:
                c = rng.randint(0x80, 0x7FF)
            elif r < 0.85:
                c = rng.randint(0x800, 0xFFFF)
            else:
                c = rng.randint(0x10000, 0x10FFFF)
            if 0xD800 <= c < 0xE000:
                c = 0xFFFD
            out.append(chr(c))
        lines.append("".join(out))
    return lines


def sec_long(sections, count):
    """Long documents (10-40 KB) stitched from the other sections."""
    pool = [s for sec in sections for s in sec if 0 < len(s) < 2000]
    lines = []
    for _ in range(count):
        target = rng.randint(10_000, 40_000)
        out, size = [], 0
        while size < target:
            s = pick(pool)
            out.append(s)
            size += len(s.encode())
            out.append(pick(["\n", "\n\n", " ", "", "\r\n", "<|im_end|>\n<|im_start|>user\n"]))
        lines.append("".join(out))
    return lines


# Lines for the added tokens of the small tokenizers (lstrip, rstrip, single_word, normalized).
ADDED_FLAG_LINES = [
    "[MASK] a [MASK]b  [MASK]  end", "word sword words word_ word! Ωmega ωmega Ωmegas xΩmega",
    "Café Cafe\u0301 CAFÉ <<< << <<<< a <<b", "hé llo hé  llo <|special|></s>",
    " ĠĠx ĠĠĠx  x", "endless end, end\tend\u00a0x", "  [MASK]\t\n", "🦀 ☃ ∑ ≠ 𝔘",
    "word\u0301 word\u200d word_x 1word word1 wordé éword", "a\u3000[MASK]\u2000b [MASK][MASK]",
    "end end  end\n\nend", "<<[MASK]>> <<<<<<",
]


def build_corpus():
    sections = [sec_edge(), sec_whitespace(250), sec_apostrophes(150), sec_digits(150),
                sec_unicode_blocks(), sec_cjk(150), sec_emoji(150), sec_combining(200),
                sec_special(200), sec_prose(150), sec_code(40), sec_fuzz(300)]
    sections.append(sec_long(sections, 12))
    return [line for sec in sections for line in sec] + ADDED_FLAG_LINES


# ---------------------------------------------------------------------------------------------
# Small tokenizers trained here, to cover what the Qwen3 file does not use

QWEN_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def learn_merges(texts, pre_tokenizer, vocab_size, alphabet):
    """A plain BPE training loop (ties broken by the pair's text, so the result is the same on
    every run, unlike HF's trainer): the vocabulary and merges of the small tokenizers."""
    counts = {}
    for text in texts:
        for piece, _ in pre_tokenizer.pre_tokenize_str(unicodedata.normalize("NFC", text)):
            counts[piece] = counts.get(piece, 0) + 1
    words = {tuple(w): n for w, n in counts.items()}
    vocab = list(dict.fromkeys(alphabet))
    merges = []
    while len(vocab) < vocab_size:
        pairs = {}
        for w, n in words.items():
            for a, b in zip(w, w[1:]):
                pairs[(a, b)] = pairs.get((a, b), 0) + n
        if not pairs:
            break
        best = min(pairs, key=lambda p: (-pairs[p], p))
        merges.append(best)
        vocab.append(best[0] + best[1])
        merged = {}
        for w, n in words.items():
            out, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and (w[i], w[i + 1]) == best:
                    out.append(best[0] + best[1])
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            merged[tuple(out)] = merged.get(tuple(out), 0) + n
        words = merged
    return {t: i for i, t in enumerate(dict.fromkeys(vocab))}, merges


def train_tiny(full_alphabet=True, unk=None):
    pre = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_PATTERN), "isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    text = PROSE + FOREIGN[:4] + CODE + [" ".join(words(50)) for _ in range(200)]
    if full_alphabet:
        alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    else:  # only the characters of the training text: others are unknown
        alphabet = sorted({ch for t in text for p, _ in pre.pre_tokenize_str(t) for ch in p})
    specials = ["<unk>"] if unk else []
    vocab, merges = learn_merges(text, pre, 600, specials + alphabet)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token=unk, fuse_unk=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre
    tok.decoder = decoders.ByteLevel()
    return json.loads(tok.to_str())


def with_added(tj):
    """Adds tokens exercising every AddedToken flag (HF assigns their ids)."""
    tok = Tokenizer.from_str(json.dumps(tj))
    tok.add_special_tokens([AddedToken("<|special|>", normalized=False), AddedToken("</s>")])
    tok.add_tokens([
        AddedToken("[MASK]", lstrip=True, rstrip=True, normalized=False),
        AddedToken("word", single_word=True, normalized=False),
        AddedToken("Café", normalized=True),
        AddedToken("Ωmega", single_word=True, normalized=True),
        AddedToken("end", rstrip=True, single_word=True, normalized=False),
        AddedToken("<<", lstrip=True, normalized=False),
        AddedToken("<<<", normalized=False),
        AddedToken("hé llo", normalized=False),
        AddedToken("ĠĠx", normalized=False),
    ])
    return json.loads(tok.to_str())


def tiny_variants():
    base = with_added(train_tiny())
    out = {}
    legacy = copy.deepcopy(base)  # merges as "a b" strings, the pre-0.20 format
    legacy["model"]["merges"] = [" ".join(m) for m in legacy["model"]["merges"]]
    out["legacy-merges"] = legacy

    gpt2 = copy.deepcopy(base)
    gpt2["normalizer"] = None
    gpt2["pre_tokenizer"] = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                             "use_regex": True}
    out["gpt2-prefix-space"] = gpt2

    ign = copy.deepcopy(base)
    ign["model"]["ignore_merges"] = True
    ign["normalizer"] = {"type": "Sequence", "normalizers": [{"type": "NFC"}]}
    ign["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"String": " "}, "behavior": "MergedWithNext", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": True}]}
    out["ignore-merges"] = ign

    for behavior in ["Removed", "MergedWithPrevious", "MergedWithNext", "Contiguous"]:
        for invert in [False, True]:
            v = copy.deepcopy(base)
            v["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": r"\p{L}|\s+|\p{N}|[,.!?]"}, "behavior": behavior,
                 "invert": invert},
                {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                 "use_regex": False}]}
            out[f"split-{behavior}-{'invert' if invert else 'plain'}"] = v

    empty = copy.deepcopy(base)  # a regex with empty matches, and Oniguruma's \h (hex digit)
    empty["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": r"x*|\h+"}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": False}]}
    out["empty-matches"] = empty

    for name, fuse in [("unk-fused", True), ("unk-plain", False)]:
        u = with_added(train_tiny(full_alphabet=False, unk="<unk>"))
        u["model"]["fuse_unk"] = fuse
        out[name] = u
    nounk = with_added(train_tiny(full_alphabet=False))
    out["no-unk"] = nounk
    return out


# ---------------------------------------------------------------------------------------------

def main():
    corpus = build_corpus()
    qwen = Tokenizer.from_file(QWEN)
    nfc = normalizers.NFC()
    golden = []
    total_ids = 0
    flag_lines = list(range(len(corpus) - len(ADDED_FLAG_LINES), len(corpus)))
    for i, line in enumerate(corpus):
        ids = qwen.encode(line, add_special_tokens=False).ids
        total_ids += len(ids)
        rec = {"kind": "encode", "i": i, "ids": ids}
        dec = qwen.decode(ids, skip_special_tokens=False)
        if dec != line:
            rec["decoded"] = dec
        norm = nfc.normalize_str(line)
        if norm != line:
            rec["nfc"] = norm
        golden.append(rec)

    # Decoding: special tokens mixed in, random ids (byte tokens that break UTF-8), and the ids of
    # corpus lines with specials; each with and without skip_special_tokens.
    n_vocab = qwen.get_vocab_size(with_added_tokens=True)
    special_ids = [qwen.token_to_id(w) for w in SPECIAL_WORDS]
    byte_ids = sorted(qwen.token_to_id(ch) for ch in pre_tokenizers.ByteLevel.alphabet())
    seqs = []
    for _ in range(150):
        seq = []
        for _ in range(rng.randint(1, 30)):
            r = rng.random()
            if r < 0.3:
                seq.append(pick(special_ids))
            elif r < 0.6:
                seq.append(pick(byte_ids))
            else:
                seq.append(rng.randrange(n_vocab))
        seqs.append(seq)
    seqs.append([])
    for i, line in enumerate(corpus):
        if "<|" in line and len(line) < 300 and rng.random() < 0.3:
            seqs.append(golden[i]["ids"])
    for seq in seqs:
        for skip in (False, True):
            golden.append({"kind": "decode", "ids": seq, "skip_special": skip,
                           "text": qwen.decode(seq, skip_special_tokens=skip)})

    # Small tokenizers on the shorter lines.
    short = [i for i, line in enumerate(corpus) if len(line) <= 400]
    for name, tj in tiny_variants().items():
        tok = Tokenizer.from_str(json.dumps(tj))
        golden.append({"kind": "tokenizer", "name": name, "json": tj})
        lines = rng.sample(short, 600 if name == "legacy-merges" else 150)
        lines = sorted(set(lines) | set(flag_lines))
        for i in lines:
            ids = tok.encode(corpus[i], add_special_tokens=False).ids
            golden.append({"kind": "tiny", "name": name, "i": i, "ids": ids})
        n = tok.get_vocab_size(with_added_tokens=True)
        for _ in range(10):
            seq = [rng.randrange(n) for _ in range(rng.randint(1, 20))]
            for skip in (False, True):
                golden.append({"kind": "tiny_decode", "name": name, "ids": seq,
                               "skip_special": skip, "text": tok.decode(seq, skip_special_tokens=skip)})

    with open(CORPUS, "w", encoding="utf-8") as f:
        for line in corpus:
            f.write(json.dumps(line, ensure_ascii=False) + "\n")
    with open(GOLDEN, "w", encoding="utf-8") as f:
        for rec in golden:
            f.write(json.dumps(rec, ensure_ascii=False, separators=(",", ":")) + "\n")
    size = sum(len(line.encode()) for line in corpus)
    print(f"corpus: {len(corpus)} lines, {size} bytes; {total_ids} Qwen3 ids; "
          f"golden file {os.path.getsize(GOLDEN)} bytes", file=sys.stderr)


if __name__ == "__main__":
    main()
