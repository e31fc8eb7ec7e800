"""What a decoding rule owns stays in the rule: a runner never decides from the mask id.

Which positions still need a decision, when a block is final and where a draft is whole are the rule's
answers (``engine.rules.base``); a runner asks for them. A runner that compares tokens with the mask id
decides instead of its rule, and a rule with other special tokens (a DELETE, a SPLIT) would be wrong there.
"""
from __future__ import annotations

import ast
from pathlib import Path

RUNNERS = Path(__file__).resolve().parents[1] / "engine" / "runner"


def mask_comparisons(path: Path) -> list[str]:
    """Each comparison in ``path`` with the mask id as an operand, as ``file:line``."""
    def is_mask_id(node: ast.AST) -> bool:
        return (isinstance(node, ast.Attribute) and node.attr == "mask_id") or (
            isinstance(node, ast.Name) and node.id == "mask_id")

    def is_none_check(node: ast.Compare) -> bool:  # "mask_id is None": whether the model has one, not a token
        return all(isinstance(op, (ast.Is, ast.IsNot)) for op in node.ops) and any(
            isinstance(operand, ast.Constant) and operand.value is None for operand in node.comparators)

    tree = ast.parse(path.read_text(), filename=str(path))
    return [f"{path.name}:{node.lineno}" for node in ast.walk(tree) if isinstance(node, ast.Compare)
            and any(is_mask_id(operand) for operand in (node.left, *node.comparators)) and not is_none_check(node)]


def test_no_runner_module_compares_tokens_with_the_mask_id():
    assert sorted(RUNNERS.glob("*.py")), "no runner modules found"
    assert [hit for path in sorted(RUNNERS.glob("*.py")) for hit in mask_comparisons(path)] == []
