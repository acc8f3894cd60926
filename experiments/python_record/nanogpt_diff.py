"""Applies the "Debug your own training loop" diff of docs/nanogpt.md to nanoGPT's model.py and train.py,
as a user would by hand, to check it against the real files (nanogpt_check.sh).

    python3 nanogpt_diff.py docs/nanogpt.md NANOGPT_DIR OUT_DIR

The diff's sections start at its " # model.py" and " # train.py" lines. In a section a context
line (" ") or a removed line ("-") must be the file's next line, or any later one right after a
" ..." line (and for the section's first line); "+" lines go in right after the line before
them, or after a " ..." right before the next matched line (at the end of the file if none
follows). A line that is not where the diff says is an error naming it: the doc no longer
matches nanoGPT."""
import os
import re
import sys


def diff_sections(readme):
    text = open(readme).read()
    start = text.index("## Debug your own training loop")
    block = re.search(r"```diff\n(.*?)```", text[start:], re.S).group(1)
    sections, name = {}, None
    for line in block.splitlines():
        m = re.fullmatch(r" # (\w+\.py)", line)
        if m:
            name = m.group(1)
            sections[name] = []
        elif name:
            sections[name].append(line)
    return sections


def apply(lines, diff, name):
    out = list(lines)
    cursor, gap = 0, True  # gap: the next matched line may lie after others
    waiting = []           # "+" lines after a " ...": they go in before the next matched line
    for d in diff:
        kind, text = d[:1], d[1:]
        if text.strip() == "...":
            gap = True
            continue
        if kind == "+":
            if gap:
                waiting.append(text)
            else:
                out.insert(cursor, text)
                cursor += 1
            continue
        if kind not in (" ", "-"):
            raise SystemExit(f"{name}: diff line without a ' ', '+' or '-': {d!r}")
        ends = range(cursor, len(out)) if gap else range(cursor, min(cursor + 1, len(out)))
        at = next((j for j in ends if out[j].rstrip() == text.rstrip()), None)
        if at is None:
            where = "at or after" if gap else "at"
            raise SystemExit(f"{name}: the diff's line {text.strip()!r} is not {where} line {cursor + 1} "
                             f"(there: {out[cursor].strip() if cursor < len(out) else 'the end'!r})")
        out[at:at] = waiting
        at += len(waiting)
        waiting = []
        if kind == "-":
            del out[at]
            cursor = at
        else:
            cursor = at + 1
        gap = False
    return out + waiting  # "+" lines after the last " ...": at the end of the file


def main():
    readme, src, dst = sys.argv[1:4]
    os.makedirs(dst, exist_ok=True)
    for name, diff in diff_sections(readme).items():
        lines = open(os.path.join(src, name)).read().splitlines()
        with open(os.path.join(dst, name), "w") as f:
            f.write("\n".join(apply(lines, diff, name)) + "\n")
        print(f"applied the diff of docs/nanogpt.md to {name}: {sum(d[:1] == '+' for d in diff)} lines in, "
              f"{sum(d[:1] == '-' for d in diff)} out")


if __name__ == "__main__":
    main()
