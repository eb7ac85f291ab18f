"""layers: every #include of the engine's C code stays inside its layer or
looks down.

The layers and what each may use are read from CMakeLists.txt (its
ml_layer() and target_link_libraries() lines), so the build and this check
share one definition. A quoted include must name its layer ("store/store.h",
"sidecar/watcher.h"), and that layer must be the file's own or one its
library links, directly or through another. Prints every violation and
exits 1; exits 0 when there is none.
"""
import os
import re
import sys

SRC = os.environ.get("MOONLOOP_SRC") or os.path.join(os.path.dirname(__file__), "..", "..")


def read_layers(cmake_text):
    """{layer: folder} and {layer: set of layers it links directly}."""
    folders, links = {}, {}
    for name, folder in re.findall(r"^ml_layer\((\w+)\s+([\w/]+)", cmake_text, re.M):
        folders[name] = folder
        links[name] = set()
    for name, deps in re.findall(r"^target_link_libraries\(ml_(\w+)\s+PUBLIC\s+([^)]*)\)",
                                 cmake_text, re.M):
        links[name] |= set(re.findall(r"\bml_(\w+)", deps))
    return folders, links


def closure(links):
    """Every layer each layer may use: itself and all it links, transitively."""
    out = {}
    for layer in links:
        seen, todo = {layer}, [layer]
        while todo:
            for d in links.get(todo.pop(), ()):
                if d not in seen:
                    seen.add(d)
                    todo.append(d)
        out[layer] = seen
    return out


def main():
    with open(os.path.join(SRC, "CMakeLists.txt")) as f:
        folders, links = read_layers(f.read())
    if len(folders) < 2:
        print("layers: found no ml_layer() lines in CMakeLists.txt")
        return 1
    allowed = closure(links)
    # An include names its layer by its folder below engine/ or the top folder.
    by_prefix = {folder[len("engine/"):] if folder.startswith("engine/") else folder: layer
                 for layer, folder in folders.items()}
    bad = []
    for layer, folder in sorted(folders.items()):
        path = os.path.join(SRC, folder)
        for name in sorted(os.listdir(path)):
            if not name.endswith((".c", ".h")):
                continue
            with open(os.path.join(path, name)) as f:
                for n, line in enumerate(f, 1):
                    m = re.match(r'\s*#\s*include\s+"([^"]+)"', line)
                    if not m:
                        continue
                    inc = m.group(1)
                    prefix = inc.split("/")[0] if "/" in inc else None
                    where = "%s/%s:%d" % (folder, name, n)
                    if prefix not in by_prefix:
                        bad.append('%s: "%s" does not name its layer (one of %s)'
                                   % (where, inc, ", ".join(sorted(by_prefix))))
                    elif by_prefix[prefix] not in allowed[layer]:
                        bad.append('%s: layer %s includes "%s" of layer %s, which it does not '
                                   "link (it may use: %s)" % (where, layer, inc, by_prefix[prefix],
                                                              ", ".join(sorted(allowed[layer]))))
                    elif not os.path.exists(os.path.join(SRC, folders[by_prefix[prefix]],
                                                         os.path.basename(inc))):
                        bad.append('%s: "%s" does not exist' % (where, inc))
    for b in bad:
        print(b)
    print("layers: %d layers, %d violations" % (len(folders), len(bad)))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
