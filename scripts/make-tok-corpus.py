#!/usr/bin/env python3
"""Tokenizer test corpus and the ids Hugging Face produces for it.

    pip install tokenizers gguf transformers     # transformers: only for SPM merges
    python3 scripts/make-tok-corpus.py           # writes tests/data/tok/{corpus.inp,expected.json}
    python3 scripts/make-tok-corpus.py --check   # only checks the references (below)
    python3 scripts/make-tok-corpus.py --show CASE N   # HF's ids for corpus string N

Reads the vocabs from ../shared/data/vocab (SMELT_SHARED_DIR) and the test models under
models/ (SMELT_MODELS_DIR); a case whose vocab is absent is left out with a note.

The reference for each case is a `tokenizers.Tokenizer` built from the GGUF's own tokens,
merges / scores and token types, with the pipeline of the model's tokenizer.json (the
PRE table: HF's own Split / ByteLevel / Digits / Punctuation / NFC components; the
patterns are the tokenizer.json originals). Before a reference is used it must reproduce
HF's ids in the shared .inp/.out pairs for its vocab (46 strings each), so a wrong
pipeline is caught here, not trusted. SPM vocabs get their merges from the vocab and
scores the way transformers' GGUF loader derives them (generate_merges); Gemma uses
transformers' GGUF tokenizer builder itself.

Outputs (committed; small):
  tests/data/tok/corpus.inp      the corpus strings, in the vocab-test format
  tests/data/tok/expected.json   per case: the vocab, the pre-tokenizer override, and per
                                 corpus string [number of ids, FNV-1a-64 of the ids as
                                 little-endian int32]; plus the same for 1 MB of random
                                 Unicode made by random_text(seed) (a seed, not the text);
                                 and "splits": per PRE name, per corpus string, [number of
                                 pre-tokens, FNV-1a-64 of their byte lengths], from HF's own
                                 normalizer and pre_tokenize_str (tok_pretokenize's reference)
"""
import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.environ.get("SMELT_SHARED_DIR", os.path.join(ROOT, "..", "shared"))
MODELS = os.environ.get("SMELT_MODELS_DIR", os.path.join(ROOT, "models"))
OUT_DIR = os.path.join(ROOT, "tests", "data", "tok")
SEP = "\n__ggml_vocab_test__\n"

RANDOM_SEED = 20261129
RANDOM_BYTES = 1 << 20

# ---------------------------------------------------------------- deterministic PRNG


class Rng:
    """xorshift64* (the same generator as tests/unit/t.h)."""

    def __init__(self, seed):
        self.s = seed & 0xFFFFFFFFFFFFFFFF or 1

    def u64(self):
        s = self.s
        s ^= s >> 12
        s ^= (s << 25) & 0xFFFFFFFFFFFFFFFF
        s ^= s >> 27
        self.s = s
        return (s * 2685821657736338717) & 0xFFFFFFFFFFFFFFFF

    def below(self, n):
        return (self.u64() >> 11) % n

    def choice(self, seq):
        return seq[self.below(len(seq))]


def fnv64(ids):
    h = 0xCBF29CE484222325
    for i in ids:
        for b in (i & 0xFFFFFFFF).to_bytes(4, "little"):
            h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


# ---------------------------------------------------------------- random Unicode

# (weight, first, last): drawn uniformly inside the chosen range. Covers ASCII and
# whitespace heavily, combining marks and Hangul jamo (NFC), many scripts, emoji with
# joiners and selectors, private use, noncharacters, unassigned and recently assigned
# code points, and the supplementary planes.
RANDOM_RANGES = [
    (30, 0x20, 0x7E), (6, 0x09, 0x0D), (2, 0x00, 0x1F), (8, 0x20, 0x20),
    (3, 0x80, 0xFF), (3, 0x100, 0x24F), (2, 0x250, 0x2FF), (3, 0x300, 0x36F),
    (2, 0x370, 0x3FF), (3, 0x400, 0x4FF), (1, 0x530, 0x58F), (2, 0x590, 0x5FF),
    (3, 0x600, 0x6FF), (2, 0x900, 0x97F), (1, 0x980, 0x9FF), (1, 0xB80, 0xBFF),
    (2, 0xE00, 0xE7F), (1, 0x10A0, 0x10FF), (2, 0x1100, 0x11FF), (1, 0x1780, 0x17FF),
    (1, 0x1800, 0x18AF), (1, 0x1C80, 0x1CBF), (1, 0x1E00, 0x1FFF), (3, 0x2000, 0x206F),
    (1, 0x2070, 0x209F), (1, 0x20A0, 0x20CF), (1, 0x2100, 0x218F), (1, 0x2190, 0x22FF),
    (1, 0x2500, 0x25FF), (1, 0x2600, 0x27BF), (2, 0x3000, 0x303F), (2, 0x3040, 0x30FF),
    (1, 0x3130, 0x318F), (6, 0x4E00, 0x9FFF), (1, 0xA000, 0xA4CF), (1, 0xA640, 0xA7FF),
    (3, 0xAC00, 0xD7A3), (1, 0xE000, 0xF8FF), (1, 0xF900, 0xFAFF), (1, 0xFB00, 0xFDFF),
    (1, 0xFE00, 0xFE0F), (1, 0xFE30, 0xFFFF), (1, 0x10000, 0x1018F), (1, 0x10400, 0x105FF),
    (1, 0x10D00, 0x10D8F), (1, 0x11000, 0x11FFF), (1, 0x16800, 0x16FFF),
    (1, 0x1D400, 0x1D7FF), (1, 0x1E900, 0x1E95F), (4, 0x1F300, 0x1F5FF),
    (2, 0x1F600, 0x1F64F), (2, 0x1F900, 0x1FAFF), (1, 0x1F1E6, 0x1F1FF),
    (1, 0x1F3FB, 0x1F3FF), (2, 0x200D, 0x200D), (1, 0x20000, 0x2A6DF), (1, 0x2A700, 0x323AF),
    (1, 0xE0000, 0xE007F), (1, 0xF0000, 0x10FFFF), (1, 0x0, 0x10FFFF),
]


def random_text(seed=RANDOM_SEED, nbytes=RANDOM_BYTES):
    """About nbytes of UTF-8: runs of random code points, runs of one repeated character
    (whitespace, digits), and runs of ASCII words."""
    rng = Rng(seed)
    total = sum(w for w, _, _ in RANDOM_RANGES)
    out, n = [], 0
    while n < nbytes:
        kind = rng.below(10)
        if kind < 6:  # random code points
            k = 1 + rng.below(40)
            for _ in range(k):
                r = rng.below(total)
                for w, a, b in RANDOM_RANGES:
                    if r < w:
                        break
                    r -= w
                cp = a + rng.below(b - a + 1)
                if 0xD800 <= cp <= 0xDFFF:
                    cp = 0xFFFD
                out.append(chr(cp))
                n += len(chr(cp).encode())
        elif kind < 8:  # words
            for _ in range(1 + rng.below(12)):
                w = "".join(chr(0x61 + rng.below(26)) for _ in range(1 + rng.below(10)))
                if rng.below(4) == 0:
                    w = w.capitalize()
                s = rng.choice([" ", " ", " ", ", ", ". ", "\n", "'s ", "'ll ", " - "]) + w
                out.append(s)
                n += len(s)
        else:  # a run of one character
            ch = rng.choice([" ", "\t", "\n", "\r\n", "0", "7", "\u3000", "\u00a0", "-", "=",
                             "!", "\u2581", "\u0120", "'", "\u200d"])
            s = ch * (1 + rng.below(70))
            out.append(s)
            n += len(s.encode())
    return "".join(out)


# ---------------------------------------------------------------- curated corpus

PROSE = [
    "The quick brown fox jumps over the lazy dog. It wasn't the dog's fault; he'd been "
    "up all night, and we've all been there, haven't we? I'm sure you'll agree.",
    "Der schnelle braune Fuchs springt über den faulen Hund. Äpfel, Öl und Übermut "
    "gehören zusammen – sagt man jedenfalls in Süddeutschland.",
    "Le vif renard brun saute par-dessus le chien paresseux. « Où est-il ? » demanda "
    "l'élève, un peu inquiet, à l'aube d'un été brûlant.",
    "El rápido zorro marrón salta sobre el perro perezoso. ¿Dónde está el niño? ¡Qué "
    "alegría verte, señora Muñoz!",
    "A rápida raposa marrom pula sobre o cão preguiçoso. Não há coração que não se "
    "emocione com as canções de São João.",
    "La volpe marrone veloce salta sopra il cane pigro. Perché non è già arrivato? "
    "Città, università e caffè.",
    "Быстрая коричневая лиса перепрыгивает через ленивую собаку. Съешь же ещё этих "
    "мягких французских булок, да выпей чаю.",
    "Швидка руда лисиця стрибає через лінивого пса. Ґанок, їжак і є — українські літери.",
    "Η γρήγορη καφέ αλεπού πηδά πάνω από το τεμπέλικο σκυλί. Ξεσκεπάζω την ψυχοφθόρα "
    "βδελυγμία.",
    "Hızlı kahverengi tilki tembel köpeğin üzerinden atlar. Pijamalı hasta yağız şoföre "
    "çabucak güvendi.",
    "Szybki brązowy lis przeskakuje nad leniwym psem. Zażółć gęślą jaźń.",
    "Con cáo nâu nhanh nhẹn nhảy qua con chó lười. Tiếng Việt có nhiều dấu thanh: à á ả ã ạ.",
    "الثعلب البني السريع يقفز فوق الكلب الكسول. مرحبا بالعالم، كيف حالك اليوم؟",
    "השועל החום המהיר קופץ מעל הכלב העצלן. שלום עולם!",
    "तेज़ भूरी लोमड़ी आलसी कुत्ते के ऊपर कूदती है। नमस्ते दुनिया, आप कैसे हैं?",
    "দ্রুত বাদামী শিয়াল অলস কুকুরের উপর দিয়ে লাফ দেয়। আমার সোনার বাংলা।",
    "வேகமான பழுப்பு நரி சோம்பேறி நாயின் மேல் குதிக்கிறது. வணக்கம் உலகம்.",
    "สุนัขจิ้งจอกสีน้ำตาลกระโดดข้ามสุนัขขี้เกียจ ภาษาไทยไม่มีการเว้นวรรคระหว่างคำ",
    "სწრაფი ყავისფერი მელა ხტება ზარმაც ძაღლზე. გამარჯობა მსოფლიო!",
    "Արագ շագանակագույն աղվեսը ցատկում է ծույլ շան վրայով։",
    "ፈጣኑ ቡናማ ቀበሮ ሰነፍ ውሻውን ዘለለ። ሰላም ለዓለም።",
    "កញ្ជ្រោងត្នោតរហ័សលោតរំលងឆ្កែខ្ជិល។ សួស្តីពិភពលោក",
    "အမြန်ပြေးသော အညိုရောင်မြေခွေးသည် ပျင်းရိသောခွေးကို ခုန်ကျော်သည်။",
    "Mbweha mwepesi wa kahawia anaruka juu ya mbwa mvivu. Habari za asubuhi?",
    "Rubah coklat yang cepat melompati anjing yang malas. Selamat pagi, apa kabar?",
    "Snöggur brúnn refur stekkur yfir lata hundinn. Þetta er ágætt, ekki satt?",
    "Ein rask brun rev hoppar over den late hunden. Blåbærsyltetøy og ærfugl.",
]

CJK = [
    "敏捷的棕色狐狸跳过了懒狗。我想在apple工作1314151天～你好，世界！这是一个测试：“引号”与（括号）。",
    "機敏な茶色の狐がのろまな犬を飛び越える。日本語のテキストとカタカナ、ひらがな、漢字。『鍵括弧』。",
    "빠른 갈색 여우가 게으른 개를 뛰어넘는다. 안녕하세요, 세계! 한국어 텍스트입니다.",
    "繁體中文：臺灣的學生們正在圖書館裡讀書。粵語：佢哋喺度食緊飯。",
    "全角文字：ＡＢＣ１２３！？　（スペース）と半角ｶﾀｶﾅ。",
    "𠀀𠀁𪚥𫝀𬺰 rare CJK extension characters 𰀀 and 〇〡〢〣.",
]

EMOJI = [
    "👨‍👩‍👧‍👦 family, 👩🏽‍💻 technologist, 🏳️‍🌈 rainbow flag, 🏴‍☠️ pirate flag",
    "🇺🇸🇯🇵🇩🇪🇫🇷 flags, 1️⃣2️⃣#️⃣ keycaps, ❤️ vs ❤, ☺️ vs ☺",
    "👍🏻👍🏼👍🏽👍🏾👍🏿 skin tones; 🧑‍🤝‍🧑 people holding hands; 😶‍🌫️ face in clouds",
    "🚀 (normal) 😶‍🌫️ (multiple emojis concatenated) ✅ 🦙🦙 🤗🤗🤗 🫠🫡🫶",
    "🏴󠁧󠁢󠁳󠁣󠁴󠁿 Scotland tag sequence, 🧔‍♀️ woman with beard, 👁️‍🗨️ eye in speech bubble",
]

CODE = [
    'def fib(n: int) -> int:\n    """Return the n-th Fibonacci number."""\n    a, b = 0, 1\n'
    "    for _ in range(n):\n        a, b = b, a + b\n    return a\n\n\nprint(fib(10))  # 55\n",
    "#include <stdio.h>\n\nint main(int argc, char **argv) {\n\tfor (int i = 0; i < argc; i++)\n"
    '\t\tprintf("%d: %s\\n", i, argv[i]);\n\treturn 0;\n}\n',
    "const add = (a, b) => a + b;\nexport default function App() {\n  return <div className=\"app\">"
    "{items.map((x) => <Item key={x.id} {...x} />)}</div>;\n}\n",
    '{"name": "smelt", "version": "0.1.0", "tags": ["llm", "inference"], "ok": true, '
    '"n": 1e-9, "nested": {"a": [1, 2, {"b": null}]}}',
    "#!/usr/bin/env bash\nset -euo pipefail\nfor f in *.gguf; do\n  echo \"$f: $(stat -c %s \"$f\")\"\n"
    "done 2>&1 | tee log.txt\n",
    "SELECT u.id, COUNT(*) AS n FROM users u JOIN orders o ON o.user_id = u.id\n"
    "WHERE o.created_at >= '2024-01-01' GROUP BY u.id HAVING n > 10 ORDER BY n DESC;",
    "<!DOCTYPE html>\n<html lang=\"en\">\n<head><meta charset=\"utf-8\"><title>Test &amp; "
    "&lt;ok&gt;</title></head>\n<body><p class='x'>Hello</p></body>\n</html>",
    "fn main() {\n    let v: Vec<u32> = (0..10).filter(|x| x % 2 == 0).collect();\n"
    '    println!("{:?}", v);\n}\n',
    "    if (x != y && (z || !w)) { return x <<= 2 >> 1; } // ->, =>, ::, ..., ?.",
    "regex = r'^(?:[a-z0-9!#$%&*+/=?^_`{|}~-]+)@(?:\\w+\\.)+\\w{2,}$'",
]

WHITESPACE = [
    " ", "  ", "   ", " " * 16, " " * 33, " " * 100, "\t", "\t\t\t", "\n", "\n\n", "\n" * 7,
    "\r\n", "\r\n\r\n", " \n \n ", "\t \t \n", "a" + " " * 50 + "b", "word   \n   word",
    "trailing spaces   ", "   leading spaces", "\u00a0nbsp\u00a0\u00a0x", "ideographic\u3000space",
    "thin\u2009space and en\u2002space", "zero\u200bwidth", "line\u2028separator",
    "x\u180ey mongolian vowel separator", "mixed \t\n\r\x0b\x0c whitespace", " " * 31 + "x",
    "\n\n\n\nHello\n\n\n", "    Hello\n    Hello", "\t\tindented\n\t\t\tmore",
]

DIGITS = [
    "0", "12", "123", "1234", "12345", "1234567890", "3.14159265358979", "1,000,000.00",
    "+1 (555) 123-4567", "2024-11-29T17:30:00Z", "v1.2.3-rc.4", "0x1F 0b1010 0o17 1e-9",
    "٠١٢٣٤٥٦٧٨٩ Arabic-Indic", "०१२३४५ Devanagari", "１２３４５ fullwidth", "x² + y³ = z¹",
    "½ ¼ ¾ ⅓ ⅞", "Ⅻ ⅻ Ⅳ roman", "①②③ ⑴⑵ circled", "99999999999999999999999999",
    "ied 4 ½ months", "3..3 3...3 33.33.33", "𝟎𝟏𝟐 math digits",
]

MIXED = [
    "Hello世界мир🌍", "I've been 'told he's there, 'RE you sure? 'M not sure I'll make it, "
    "'D you like some tea? We'Ve a'lL", "IT'S DON'T WE'LL THEY'RE I'D", "x'ſ y'S z'K",
    "naïve café résumé coöperate", "e\u0301 a\u0308 o\u0302\u0323 (decomposed marks)",
    "\u1100\u1161\u11a8 \u1112\u1161\u11ab (Hangul jamo)", "A\u030a vs \u00c5 vs \u212b",
    "\u1e9b\u0323 \u0071\u0307\u0323", "ﬁ ﬂ ligatures", "Ǆ ǅ ǆ titlecase",
    "right-to-left: \u202eevil\u202c and \u200fmark", "Ｈｅｌｌｏ，Ｗｏｒｌｄ！",
    "combining at start: \u0301a", "\u0915\u094d\u0937 conjunct", "\U0001d400\U0001d401 math bold",
    "<|im_start|>user\nhi<|im_end|>", "<s>[INST] hello [/INST]</s>", "<|endoftext|>",
    "<start_of_turn>user\nhello<end_of_turn>", "<0x41> <unk> <pad>", "▁ Ġ Ċ literal markers",
    "<|im_start|><|im_start|>", "<|im_sta", "a<|endoftext|>b", "\x00nul\x00byte",
    "tab\tseparated\tvalues\nand,commas,too", "email@example.com https://example.org/a?b=c#d",
    "$100 €200 £300 ¥400 ₹500 ₿", "→ ← ↑ ↓ ⇒ ∀x∈ℝ: x² ≥ 0", "——— ––– ... … ·•",
    "«guillemets» „Anführung“ “curly” ‘single’", "Mr. Smith's dog's bone's marrow",
]


def corpus():
    """The curated strings, then deterministic random mixes of them."""
    base = PROSE + CJK + EMOJI + CODE + WHITESPACE + DIGITS + MIXED
    rng = Rng(7)
    out = list(base)
    pool = "".join(base)
    for _ in range(60):  # random slices of the pool glued together
        parts = []
        for _ in range(1 + rng.below(4)):
            a = rng.below(len(pool))
            parts.append(pool[a:a + 1 + rng.below(120)])
        out.append(rng.choice(["", " ", "\n", "  "]).join(parts))
    text = random_text(12345, 20000)  # a little random Unicode, in pieces
    for i in range(0, len(text), 500):
        out.append(text[i:i + 500])
    return out


# ---------------------------------------------------------------- GGUF vocab


def read_vocab(path):
    import gguf

    r = gguf.GGUFReader(path)

    def field(k):
        return r.fields.get(k)

    def scalar(k, d=None):
        f = field(k)
        if f is None:
            return d
        v = f.parts[f.data[0]]
        if f.types[0] == gguf.GGUFValueType.STRING:
            return bytes(v).decode("utf-8")
        return v[0].item()

    def strings(k):
        f = field(k)
        return None if f is None else [bytes(f.parts[i]).decode("utf-8") for i in f.data]

    def numbers(k):
        f = field(k)
        return None if f is None else [f.parts[i][0].item() for i in f.data]

    v = {
        "model": scalar("tokenizer.ggml.model"),
        "pre": scalar("tokenizer.ggml.pre", "default"),
        "arch": scalar("general.architecture", ""),
        "name": scalar("general.name", ""),
        "tokens": strings("tokenizer.ggml.tokens"),
        "types": numbers("tokenizer.ggml.token_type"),
        "scores": numbers("tokenizer.ggml.scores"),
        "merges": strings("tokenizer.ggml.merges"),
        "add_space_prefix": bool(scalar("tokenizer.ggml.add_space_prefix", True)),
        "lowercase": bool(scalar("tokenizer.ggml.normalizer.lowercase", True)),
        "strip_accents": scalar("tokenizer.ggml.normalizer.strip_accents"),
    }
    for k in ("bos", "eos", "unknown", "padding"):
        v[k] = scalar("tokenizer.ggml.%s_token_id" % k)
    if v["types"] is None:
        v["types"] = [1] * len(v["tokens"])
    return v


# ---------------------------------------------------------------- references

GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
          r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
         r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN35 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
          r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
O200K = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
         r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+"
         r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}"
         r"| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
CJK_RE = "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+"
DS_LETTERS = ("\\s?[A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293"
              "\u0295-\u02af\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c"
              "\u038e-\u03a1\u03a3-\u03f5\u03f7-\u0481\u048a-\u052f\u0531-\u0556\u10a0-\u10c5"
              "\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77"
              "\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d\u1f50-\u1f57"
              "\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4"
              "\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc"
              "\u2102\u2107\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d"
              "\u212f-\u2134\u2139\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b"
              "\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3\ua640-\ua66d\ua680-\ua69b\ua722-\ua76f"
              "\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17\uff21-\uff3a"
              "\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3\U000104d8-\U000104fb"
              "\U00010c80-\U00010cb2\U00010cc0-\U00010cf2\U000118a0-\U000118df"
              "\U0001e900-\U0001e943]+")
DS_PUNCT = "\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+"

# name -> (nfc, ignore_merges, steps); a step is ("split", pattern) | ("bytelevel", use_regex)
#         | ("digits", individual) | ("punct",) | ("split3",)
PRE = {
    "gpt-2": (False, False, [("bytelevel", True)]),
    "mpt": (True, False, [("bytelevel", True)]),
    "olmo": (True, False, [("bytelevel", True)]),
    "llama-bpe": (False, True, [("split", LLAMA3), ("bytelevel", False)]),
    "qwen2": (True, False, [("split", QWEN2), ("bytelevel", False)]),
    "deepseek-llm": (False, False, [("split", "[\r\n]"), ("split", DS_LETTERS),
                                    ("split", DS_PUNCT), ("split", r"\s+$"), ("split", CJK_RE),
                                    ("digits", False), ("bytelevel", False)]),
    "deepseek-coder": (False, False, [("split", "[\r\n]"), ("split", r"\s?\p{L}+"),
                                      ("split", r"\s?\p{P}+"), ("split", CJK_RE),
                                      ("digits", True), ("bytelevel", False)]),
    "starcoder": (False, False, [("digits", True), ("bytelevel", True)]),
    "refact": (False, False, [("digits", True), ("bytelevel", True)]),
    "smollm": (False, False, [("digits", True), ("bytelevel", True)]),
    "command-r": (True, False, [("digits", True), ("bytelevel", True)]),
    "falcon": (False, False, [("punct",), ("bytelevel", True), ("digits", False), ("split3",)]),
    # transformers' Qwen3_5Tokenizer
    "qwen35": (True, False, [("split", QWEN35), ("bytelevel", False)]),
    # tiktoken's o200k_base through transformers' TikTokenConverter (gpt-oss, Llama 4)
    "gpt-4o": (False, True, [("split", O200K), ("bytelevel", False)]),
    "llama4": (False, True, [("split", O200K), ("bytelevel", False)]),
}


def byte_alphabet():
    bs = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def added_tokens(v, byte_level):
    """AddedToken list: control / unknown as special, user-defined as plain added
    tokens (matched whole in raw text); Phi-3's rstrip rule."""
    from tokenizers import AddedToken

    phi3 = "phi-3" in v["name"].lower() or "phi3" in v["name"].lower()
    out = []
    for i, (t, ty) in enumerate(zip(v["tokens"], v["types"])):
        if ty not in (2, 3, 4) or not t:
            continue
        rstrip = phi3 and t not in ("<unk>", "<s>", "<|endoftext|>")
        out.append((i, AddedToken(t, normalized=False, special=ty != 4, rstrip=rstrip)))
    return out


def pipeline(pre):
    """The normalizer (or None) and pre-tokenizer of PRE[pre], as HF components."""
    from tokenizers import Regex, normalizers, pre_tokenizers

    nfc, _, steps = PRE[pre]
    pts = []
    for st in steps:
        if st[0] == "split":
            pts.append(pre_tokenizers.Split(Regex(st[1]), behavior="isolated", invert=False))
        elif st[0] == "bytelevel":
            pts.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=st[1]))
        elif st[0] == "digits":
            pts.append(pre_tokenizers.Digits(individual_digits=st[1]))
        elif st[0] == "punct":
            pts.append(pre_tokenizers.Punctuation(behavior="contiguous"))
        elif st[0] == "split3":
            pts.append(pre_tokenizers.Split(Regex("[0-9][0-9][0-9]"), behavior="isolated",
                                            invert=False))
    return (normalizers.NFC() if nfc else None), pre_tokenizers.Sequence(pts)


def split_lengths(pre, s):
    """The byte lengths of HF's pre-tokens of s under PRE[pre] (after its normalizer). Every
    pipeline ends in ByteLevel, so a piece's length in characters is its length in bytes."""
    norm, pt = pipeline(pre)
    if norm is not None:
        s = norm.normalize_str(s)
    return [len(p) for p, _ in pt.pre_tokenize_str(s)]


def build_bpe(v, pre):
    from tokenizers import Tokenizer, decoders, models

    alpha = byte_alphabet()
    alphabet = set(alpha.values())
    vocab = {}
    for i, (t, ty) in enumerate(zip(v["tokens"], v["types"])):
        # added tokens keep their text (so the added token finds its id); others are
        # byte-level strings, or plain text that gets spelled in the byte alphabet
        plain = ty in (2, 3, 4) or set(t) <= alphabet
        vocab[t if plain else "".join(alpha[b] for b in t.encode("utf-8"))] = i
    merges = [tuple(m.split(" ", 1)) for m in v["merges"]]
    _, ignore, _ = PRE[pre]
    tk = Tokenizer(models.BPE(vocab, merges, ignore_merges=ignore, fuse_unk=False))
    norm, tk.pre_tokenizer = pipeline(pre)
    if norm is not None:
        tk.normalizer = norm
    tk.decoder = decoders.ByteLevel()
    adds = added_tokens(v, True)
    tk.add_special_tokens([a for _, a in adds if a.special])
    tk.add_tokens([a for _, a in adds if not a.special])
    for i, a in adds:
        assert tk.token_to_id(a.content) == i, (a.content, i, tk.token_to_id(a.content))
    return tk


def build_spm(v):
    from tokenizers import Tokenizer, decoders, models, normalizers

    if v["arch"].startswith("gemma"):
        # transformers' own GGUF builder (Gemma's respelled whitespace tokens, merges in
        # file order).
        from transformers.integrations.gguf.gguf_tokenizer_mapping import convert_gguf_tokenizer

        d = {"tokenizer_type": "llama", "tokens": v["tokens"], "scores": v["scores"],
             "token_type": v["types"], "bos_token_id": v["bos"], "eos_token_id": v["eos"],
             "unk_token_id": v["unknown"], "pad_token_id": v["padding"],
             "add_prefix_space": v["add_space_prefix"]}
        tk, _ = convert_gguf_tokenizer(v["arch"], d)
        return tk
    from transformers.tokenization_utils_base import generate_merges

    vocab = {t: i for i, t in enumerate(v["tokens"])}
    merges = generate_merges(vocab, dict(zip(v["tokens"], v["scores"])))
    unk = v["tokens"][v["unknown"]] if v["unknown"] is not None else None
    tk = Tokenizer(models.BPE(vocab, merges, byte_fallback=True, fuse_unk=True, unk_token=unk))
    norm = [normalizers.Replace(" ", "\u2581")]
    if v["add_space_prefix"]:
        norm.insert(0, normalizers.Prepend("\u2581"))
    tk.normalizer = normalizers.Sequence(norm)
    tk.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                    decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    adds = added_tokens(v, False)
    tk.add_special_tokens([a for _, a in adds if a.special])
    tk.add_tokens([a for _, a in adds if not a.special])
    return tk


def build_wpm(v):
    """BERT's tokenizer as its tokenizer.json builds it (HF's BertNormalizer,
    BertPreTokenizer, WordPiece), over the GGUF's vocab in HF's spelling: llama.cpp's
    phantom-space form undone (a bracketed token as it is, "\u2581x" -> "x", else "##x")."""
    from tokenizers import AddedToken, Tokenizer, models, normalizers, pre_tokenizers

    def hf(t):
        if t.startswith("[") and t.endswith("]"):
            return t
        return t[1:] if t.startswith("\u2581") else "##" + t

    toks = [hf(t) for t in v["tokens"]]
    vocab = {t: i for i, t in enumerate(toks)}
    tk = Tokenizer(models.WordPiece(vocab, unk_token=toks[v["unknown"]],
                                    continuing_subword_prefix="##", max_input_chars_per_word=100))
    tk.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True,
                                               strip_accents=v["strip_accents"],
                                               lowercase=v["lowercase"])
    tk.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tk.add_special_tokens([AddedToken(toks[i], special=True, normalized=False)
                           for i, ty in enumerate(v["types"]) if ty == 3])
    return tk


def reference(path, pre=None):
    v = read_vocab(path)
    if v["model"] == "bert":
        return build_wpm(v)
    if v["model"] == "gpt2":
        p = pre or v["pre"]
        return build_bpe(v, p if p in PRE else "gpt-2")
    if v["model"] == "llama":
        return build_spm(v)
    raise SystemExit("%s: tokenizer model %s not covered" % (path, v["model"]))


# ---------------------------------------------------------------- cases


def gguf_str_kv(path, key):
    """The string value of key in a GGUF file's metadata, or None. Reads only as far as
    the key (gguf.GGUFReader would parse a 262k-token vocab first)."""
    import struct

    sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
    with open(path, "rb") as f:
        magic, version, _, nkv = struct.unpack("<4sIQQ", f.read(24))
        if magic != b"GGUF" or version < 2:
            return None

        def rstr():
            (n,) = struct.unpack("<Q", f.read(8))
            return f.read(n)

        def skip(t):
            if t == 8:
                rstr()
            elif t == 9:
                et, n = struct.unpack("<IQ", f.read(12))
                if et in sizes:
                    f.seek(sizes[et] * n, 1)
                else:
                    for _ in range(n):
                        skip(et)
            else:
                f.seek(sizes[t], 1)

        for _ in range(nkv):
            k = rstr().decode("utf-8", "replace")
            (t,) = struct.unpack("<I", f.read(4))
            if k == key:
                return rstr().decode("utf-8", "replace") if t == 8 else None
            skip(t)
    return None


# The project's test models (scripts/fetch-test-models.sh) come first: the recorded
# expectations are for their vocabs.
PREFERRED = ["qwen2.5-coder-0.5b-instruct-awq-q4_k_m.gguf", "gemma3-270m-q4_k_m.gguf",
             "all-minilm-l6-v2-f16.gguf"]


def find_model(key, want):
    if not os.path.isdir(MODELS):
        return None
    names = sorted(os.listdir(MODELS))
    for f in [p for p in PREFERRED if p in names] + names:
        if f.endswith(".gguf") and not f.startswith("."):
            p = os.path.join(MODELS, f)
            if gguf_str_kv(p, key) == want:
                return p
    return None


# name -> (vocab source, pre override). A source is "shared:NAME" (the shared vocab file)
# or "pre:VALUE" / "arch:VALUE" (a model under models/ with that tokenizer.ggml.pre /
# general.architecture). The overrides run another pre-tokenizer on GPT-2's vocab, to
# cover pre-tokenizers that have no vocab file here.
CASES = {
    "gpt-2": ("shared:gpt-2", None),
    "starcoder": ("shared:starcoder", None),
    "deepseek-llm": ("shared:deepseek-llm", None),
    "llama-spm": ("shared:llama-spm", None),
    "phi-3": ("shared:phi-3", None),
    "qwen2": ("pre:qwen2", None),
    "gemma3": ("arch:gemma3", None),
    "bert": ("arch:bert", None),  # all-MiniLM-L6-v2's WordPiece (bert-base-uncased's vocab)
    "gpt-2+llama-bpe": ("shared:gpt-2", "llama-bpe"),
    "gpt-2+deepseek-coder": ("shared:gpt-2", "deepseek-coder"),
    "gpt-2+falcon": ("shared:gpt-2", "falcon"),
    "gpt-2+mpt": ("shared:gpt-2", "mpt"),
    "gpt-2+olmo": ("shared:gpt-2", "olmo"),
    "gpt-2+refact": ("shared:gpt-2", "refact"),
    "gpt-2+smollm": ("shared:gpt-2", "smollm"),
    "gpt-2+command-r": ("shared:gpt-2", "command-r"),
    "gpt-2+qwen2": ("shared:gpt-2", "qwen2"),
    "gpt-2+qwen35": ("shared:gpt-2", "qwen35"),
    "gpt-2+gpt-4o": ("shared:gpt-2", "gpt-4o"),
}


def case_path(src):
    kind, name = src.split(":", 1)
    if kind == "shared":
        p = os.path.join(SHARED, "data", "vocab", "ggml-vocab-%s.gguf" % name)
        return p if os.path.exists(p) else None
    key = {"pre": "tokenizer.ggml.pre", "arch": "general.architecture"}[kind]
    return find_model(key, name)


def check_pairs(tk, name):
    """The reference must reproduce the shared .inp/.out ids of its vocab."""
    base = os.path.join(SHARED, "data", "vocab", "ggml-vocab-%s.gguf" % name)
    if not os.path.exists(base + ".inp"):
        return None
    strs = open(base + ".inp", encoding="utf-8").read().split(SEP)[:-1]
    outs = open(base + ".out", encoding="utf-8").read().split("\n")[:-1]
    bad = 0
    for s, o in zip(strs, outs):
        want = [int(x) for x in o.split()]
        got = tk.encode(s, add_special_tokens=False).ids
        if got != want:
            bad += 1
            print("  %s: %r\n    HF .out %s\n    ref     %s" % (name, s[:50], want, got))
    return bad


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--show", nargs=2, metavar=("CASE", "N"))
    ap.add_argument("--cases", help="comma-separated subset")
    args = ap.parse_args()

    texts = corpus()
    if args.show:
        src, pre = CASES[args.show[0]]
        tk = reference(case_path(src), pre)
        s = texts[int(args.show[1])]
        print(repr(s))
        print(" ".join(str(i) for i in tk.encode(s, add_special_tokens=False).ids))
        return

    names = args.cases.split(",") if args.cases else list(CASES)
    result = {"random": {"seed": RANDOM_SEED, "bytes": RANDOM_BYTES}, "cases": {}}
    rnd = None if args.check else random_text()
    failed = False
    for name in names:
        src, pre = CASES[name]
        path = case_path(src)
        if not path:
            print("%s: vocab %s absent: left out" % (name, src))
            continue
        tk = reference(path, pre)
        pair = {"shared:gpt-2": "gpt-2", "shared:starcoder": "starcoder",
                "shared:deepseek-llm": "deepseek-llm", "shared:llama-spm": "llama-spm",
                "shared:phi-3": "phi-3", "pre:qwen2": "qwen2"}.get(src) if pre is None else None
        if pair:
            bad = check_pairs(tk, pair)
            print("%s: reference vs HF .out: %s" % (name, "ok" if not bad else "%d differ" % bad))
            failed |= bool(bad)
        if args.check:
            continue
        rows = []
        for s in texts:
            ids = tk.encode(s, add_special_tokens=False).ids
            rows.append([len(ids), "%016x" % fnv64(ids)])
        ids = tk.encode(rnd, add_special_tokens=False).ids
        result["cases"][name] = {"vocab": src, "pre": pre, "corpus": rows,
                                 "random": [len(ids), "%016x" % fnv64(ids)]}
        print("%s: %d strings, random: %d ids" % (name, len(rows), len(ids)))
    if failed:
        raise SystemExit("a reference does not reproduce HF's .out ids: fix it first")
    if args.check:
        return
    # every pre-tokenizer's split of every corpus string, exactly (no vocab involved)
    splits = {}
    for pre in PRE:
        rows = []
        for s in texts:
            lens = split_lengths(pre, s)
            rows.append([len(lens), "%016x" % fnv64(lens)])
        splits[pre] = rows
    print("splits: %d pre-tokenizers" % len(splits))
    os.makedirs(OUT_DIR, exist_ok=True)
    with open(os.path.join(OUT_DIR, "corpus.inp"), "w", encoding="utf-8", newline="") as f:
        for s in texts:
            f.write(s + SEP)
    path = os.path.join(OUT_DIR, "expected.json")
    old = {}
    if args.cases and os.path.exists(path):
        old = json.load(open(path))["cases"]
    old.update(result["cases"])
    result["cases"] = old
    result["splits"] = splits
    result["generated_with"] = {"tokenizers": __import__("tokenizers").__version__}
    with open(path, "w") as f:
        json.dump(result, f, indent=0, sort_keys=True)
        f.write("\n")
    print("wrote", OUT_DIR)


if __name__ == "__main__":
    main()
