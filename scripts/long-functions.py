#!/usr/bin/env python3
"""Lists Rust functions longer than a limit (default 100 lines), longest first.

    scripts/long-functions.py [--limit N] [--tests] PATH...

A function's length runs from its `fn` line to its closing brace. Test code (files under
tests/, benches/, and `#[cfg(test)] mod tests` blocks) is skipped unless --tests is given.
Strings, chars and comments are skipped while matching braces, so a brace inside them does
not end a function early. Used for issue 56's "no function over 100 lines" (see
docs/ARCHITECTURE.md).
"""
import argparse, os, re, sys

FN = re.compile(r'^\s*(?:pub(?:\([^)]*\))?\s+)?(?:const\s+)?(?:async\s+)?(?:unsafe\s+)?(?:extern\s+"[^"]*"\s+)?fn\s+([A-Za-z_][A-Za-z0-9_]*)')

def code_only(text):
    """The text with strings, chars and comments blanked (newlines kept)."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith('//', i):
            j = text.find('\n', i)
            j = n if j < 0 else j
            out.append(' ' * (j - i)); i = j
        elif text.startswith('/*', i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith('/*', j): depth += 1; j += 2
                elif text.startswith('*/', j): depth -= 1; j += 2
                else: j += 1
            out.append(re.sub(r'[^\n]', ' ', text[i:j])); i = j
        elif c == 'r' and re.match(r'r#*"', text[i:i+10]) and (i == 0 or not (text[i-1].isalnum() or text[i-1] == '_')):
            m = re.match(r'r(#*)"', text[i:])
            end = '"' + m.group(1)
            j = text.find(end, i + len(m.group(0)))
            j = n if j < 0 else j + len(end)
            out.append(re.sub(r'[^\n]', ' ', text[i:j])); i = j
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == '\\' else 1
            j += 1
            out.append(re.sub(r'[^\n]', ' ', text[i:j])); i = j
        elif c == "'":
            m = re.match(r"'(?:\\.|\\u\{[0-9a-fA-F]+\}|[^\\'])'", text[i:])
            if m:
                out.append(' ' * len(m.group(0))); i += len(m.group(0))
            else:
                out.append(c); i += 1  # a lifetime
        else:
            out.append(c); i += 1
    return ''.join(out)

def functions(path):
    text = open(path, encoding='utf-8').read()
    code = code_only(text)
    lines = code.split('\n')
    test_from = None
    for k, line in enumerate(lines):
        if re.match(r'\s*#\[cfg\(test\)\]', line) and k + 1 < len(lines) and re.match(r'\s*(pub\s+)?mod\s', lines[k + 1]):
            test_from = k
            break
    for k, line in enumerate(lines):
        m = FN.match(line)
        if not m:
            continue
        # find the body's opening brace (or a `;` for a declaration)
        depth, started, end = 0, False, None
        for j in range(k, len(lines)):
            for ch in lines[j]:
                if ch == ';' and not started and depth == 0:
                    end = -1; break
                if ch == '{':
                    depth += 1; started = True
                elif ch == '}':
                    depth -= 1
                    if started and depth == 0:
                        end = j; break
            if end is not None:
                break
        if end is None or end < 0:
            continue
        yield m.group(1), k + 1, end - k + 1, (test_from is not None and k > test_from)

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--limit', type=int, default=100)
    ap.add_argument('--tests', action='store_true')
    ap.add_argument('paths', nargs='+')
    args = ap.parse_args()
    found = []
    for root in args.paths:
        for dirpath, _, files in os.walk(root):
            parts = dirpath.split(os.sep)
            if not args.tests and ('tests' in parts or 'benches' in parts or 'target' in parts):
                continue
            for f in files:
                if f.endswith('.rs'):
                    p = os.path.join(dirpath, f)
                    for name, line, length, in_tests in functions(p):
                        if length > args.limit and (args.tests or not in_tests):
                            found.append((length, f'{p}:{line}', name))
    for length, where, name in sorted(found, reverse=True):
        print(f'{length:5}  {where}  {name}')
    print(f'{len(found)} function(s) over {args.limit} lines', file=sys.stderr)
    return 0

if __name__ == '__main__':
    sys.exit(main())
