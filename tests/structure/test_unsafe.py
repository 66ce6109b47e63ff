"""Unsafe code states its contract: every `unsafe fn` in src/ has a `# Safety` section in its doc
comment (what a caller must guarantee), and the crate denies `unsafe_op_in_unsafe_fn`, so that
inside such a function each unsafe operation still sits in an `unsafe { }` block, which clippy's
`undocumented_unsafe_blocks` (denied too) makes carry its `// SAFETY:` reason. Methods of a
trait impl (`impl Trait for Type`) are covered by the contract on the trait's declaration.
Read as text; plain pytest, no build."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

_UNSAFE_FN = re.compile(r"\bunsafe\s+(?:extern\s+\"[^\"]*\"\s+)?fn\s+(\w+)")


def blank_comments_and_strings(code: str) -> str:
    """`code` with the text of comments, string and char literals replaced by spaces (newlines
    kept), so positions and line numbers stay those of the source."""
    out = list(code)
    i, n = 0, len(code)

    def blank(start: int, end: int) -> None:
        for k in range(start, min(end, n)):
            if out[k] != "\n":
                out[k] = " "

    while i < n:
        c = code[i]
        if code.startswith("//", i):
            end = code.find("\n", i)
            end = n if end < 0 else end
            blank(i, end)
            i = end
        elif code.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if code.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif code.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            blank(i, j)
            i = j
        elif (raw := re.match(r"b?r(#*)\"", code[i:i + 260])) and (i == 0 or not (
                code[i - 1].isalnum() or code[i - 1] == "_")):
            close = '"' + raw.group(1)
            end = code.find(close, i + raw.end())
            end = n if end < 0 else end + len(close)
            blank(i, end)
            i = end
        elif c == '"':
            j = i + 1
            while j < n and code[j] != '"':
                j += 2 if code[j] == "\\" else 1
            blank(i, j + 1)
            i = j + 1
        elif c == "'":
            # A char literal ('x', '\n', '\u{..}'), or else a lifetime ('a).
            if code.startswith("\\", i + 1):
                end = code.find("'", i + 3)
            elif i + 2 < n and code[i + 2] == "'":
                end = i + 2
            else:
                i += 1
                continue
            blank(i, end + 1)
            i = end + 1
        else:
            i += 1
    return "".join(out)


def enclosing_headers(code: str) -> list[tuple[int, int, str]]:
    """(start, end, header) of every brace block: the header is the text before its `{`, back
    to the previous `;`, `{` or `}`."""
    blocks, stack, last_boundary = [], [], 0
    for i, c in enumerate(code):
        if c == "{":
            stack.append((i, code[last_boundary:i].strip()))
            last_boundary = i + 1
        elif c == "}":
            if stack:
                start, header = stack.pop()
                blocks.append((start, i, header))
            last_boundary = i + 1
        elif c == ";":
            last_boundary = i + 1
    return blocks


def in_trait_impl(blocks: list[tuple[int, int, str]], position: int) -> bool:
    return any(start < position < end and re.match(r"(unsafe\s+)?impl\b.*\bfor\b", header, re.S)
               for start, end, header in blocks)


def doc_above(lines: list[str], index: int) -> list[str]:
    """The `///` lines of the item declared on line `index`, past its attributes."""
    docs, k, in_attribute = [], index - 1, False
    while k >= 0:
        line = lines[k].strip()
        if line.startswith("///"):
            docs.append(line)
        elif line.startswith("#[") or line.startswith("#!["):
            in_attribute = False
        elif in_attribute or line.endswith(")]") or line == "]":
            in_attribute = not (line.startswith("#[") or line.startswith("#!["))
        elif line.startswith("//"):
            pass  # a plain comment between the doc and the item
        else:
            break
        k -= 1
    return docs[::-1]


def unsafe_fns_without_safety_section(text: str) -> list[tuple[int, str]]:
    """(line, name) of each `unsafe fn` declared in `text` without a `# Safety` doc section,
    methods of trait impls left out."""
    code = blank_comments_and_strings(text)
    blocks = enclosing_headers(code)
    lines = text.split("\n")
    missing = []
    for match in _UNSAFE_FN.finditer(code):
        if in_trait_impl(blocks, match.start()):
            continue
        index = code.count("\n", 0, match.start())
        if not any(re.fullmatch(r"///\s*#\s+Safety\s*", d) for d in doc_above(lines, index)):
            missing.append((index + 1, match.group(1)))
    return missing


def test_every_unsafe_fn_has_a_safety_contract():
    files = sorted((ROOT / "src").rglob("*.rs"))
    assert files
    found = [f"{path.relative_to(ROOT)}:{line} unsafe fn {name}"
             for path in files for line, name in unsafe_fns_without_safety_section(
                 path.read_text())]
    assert not found, "unsafe fns without a `/// # Safety` section:\n" + "\n".join(found)


def cargo_settings(text: str) -> dict[str, dict[str, str]]:
    """Cargo.toml's `key = value` lines per `[section]` (values as written, quotes dropped)."""
    sections: dict[str, dict[str, str]] = {}
    current = ""
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if header := re.fullmatch(r"\[([^\]]+)\]", line):
            current = header.group(1).strip()
        elif setting := re.fullmatch(r"([\w-]+)\s*=\s*(.+)", line):
            sections.setdefault(current, {})[setting.group(1)] = setting.group(2).strip().strip('"')
    return sections


def test_the_crate_denies_unsafe_operations_outside_unsafe_blocks():
    settings = cargo_settings((ROOT / "Cargo.toml").read_text())
    assert settings.get("lints.rust", {}).get("unsafe_op_in_unsafe_fn") == "deny"
    assert settings.get("lints.clippy", {}).get("undocumented_unsafe_blocks") == "deny"


# Written like the code this check was added for (kernels/x86.rs before it had contracts).
OLD_TANGLE = '''
trait Lanes {
    /// Load `WIDTH` float16 values and widen them.
    unsafe fn load_f16(src: *const u16) -> Self::V;
    /// # Safety
    /// The level's instructions.
    unsafe fn add(a: Self::V, b: Self::V) -> Self::V;
}

impl Lanes for Avx2 {
    #[inline(always)]
    unsafe fn load_f16(src: *const u16) -> __m256 {
        _mm256_cvtph_ps(_mm_loadu_si128(src.cast()))
    }
}

#[inline(always)]
unsafe fn sixteen_loop<L: Lanes, F: Format>(
    vector: unsafe fn(L::V, L::V) -> L::V,
) {
    let s = "unsafe fn in_a_string() {}"; // unsafe fn in_a_comment
}

/// Documented, but without the section.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn combine_avx2(op: ReduceOp) {}

/// # Safety
/// The CPU must support AVX2.
#[target_feature(
    enable = "avx2,fma,f16c"
)]
pub(super) unsafe fn combine_checked(op: ReduceOp) {}
'''


def test_the_check_catches_unsafe_fns_without_a_contract():
    """On code shaped like the old kernels: the trait method and the free functions without a
    section are reported; the trait impl, a fn pointer type, strings and comments, and a
    documented fn behind a multi-line attribute are not."""
    assert [name for _, name in unsafe_fns_without_safety_section(OLD_TANGLE)] == [
        "load_f16", "sixteen_loop", "combine_avx2"]
