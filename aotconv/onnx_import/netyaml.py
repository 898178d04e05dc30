"""An imported model as net.yaml text: one flow mapping per layer, each with a comment naming
the ONNX node(s) it computes, so the file reads like the shipped networks and can be edited."""
import yaml


def _comment(names):
    # node names are arbitrary text: escaped so that none can end the comment's line
    return ", ".join(ascii(n)[1:-1] for n in names)


def dump(imported):
    d = imported.description
    opset = f"opset {imported.opset}"
    if imported.source_opset != imported.opset:
        opset += f", converted from {imported.source_opset}"
    lines = [f"# imported by `aotconv import` from {_comment([imported.path])} (ONNX {opset}).",
             "# Each layer's comment names the ONNX node(s) it computes; its weights are in the",
             "# .npz written beside this file (aotconv build THIS.yaml --weights THAT.npz).",
             f"name: {d['name']}"]
    if "inputs" in d:                 # several, by name, in the model's order
        lines.append("inputs: " + _flow(d["inputs"]))
    else:
        lines.append(f"input: [{', '.join(map(str, d['input']))}]")
    if "outputs" in d:
        lines.append("outputs: " + _flow(d["outputs"]))
    lines.append("layers:")
    prev = "input" if "input" in d else None
    for layer in d["layers"]:
        entry = {k: v for k, v in layer.items() if k != "inputs"}
        if layer["inputs"] != [prev]:
            entry["inputs"] = layer["inputs"]
        lines.append(f"  - {_flow(entry)}  # {_comment(imported.origins[layer['name']])}")
        prev = layer["name"]
    return "\n".join(lines) + "\n"


def _flow(value):
    return yaml.safe_dump(value, default_flow_style=True, width=2**31 - 1,
                          sort_keys=False).strip()
