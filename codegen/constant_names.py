"""A kind's declared constants are keyword arguments of the emitted functions, read by name in their statements: a
name the module binds otherwise (a local such as ``batch`` or ``d``, an import such as ``np``, a builtin, another
argument) would shadow the constant or be shadowed by it, and the module would compute with another value."""

from __future__ import annotations

import ast
import builtins

from splitformer.symbolic.errors import SplitformerError

__all__ = ["check_constant_names"]


def _rebinds_itself(node: ast.AST, name: str) -> bool:
    """``name = _name(name)`` (the emitted argument check, which rebinds the constant to its checked value) or
    ``name = self.name`` (a torch ``Block`` reading the value it holds)."""
    if not (isinstance(node, ast.Assign) and len(node.targets) == 1):
        return False
    checked = ast.dump(ast.Call(ast.Name(f"_{name}", ast.Load()), [ast.Name(name, ast.Load())], []))
    held = ast.dump(ast.Attribute(ast.Name("self", ast.Load()), name, ast.Load()))
    return ast.dump(node.value) in (checked, held)


def _other_bindings(tree: ast.Module, name: str) -> list[str]:
    """Where ``tree`` binds ``name`` otherwise than as one argument of a function or its own check."""
    found = []
    allowed = {id(node.targets[0]) for node in ast.walk(tree) if _rebinds_itself(node, name)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store) and node.id == name and id(node) not in allowed:
            found.append(f"a variable on line {node.lineno}")
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name == name:
            found.append(f"a {'class' if isinstance(node, ast.ClassDef) else 'function'} on line {node.lineno}")
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            found += [f"an import on line {node.lineno}" for alias in node.names
                      if (alias.asname or alias.name.split(".")[0]) == name]
        elif isinstance(node, (ast.FunctionDef, ast.Lambda)):
            arguments = node.args.posonlyargs + node.args.args + node.args.kwonlyargs
            if sum(argument.arg == name for argument in arguments) > 1:
                found.append(f"another argument of a function on line {node.lineno}")
    return found


def check_constant_names(source: str, constants: tuple, where: str) -> str:
    """``source`` unchanged when each declared constant's name is bound in it only as itself; else one
    ``SplitformerError`` starting with ``where`` naming the constant and the other binding."""
    tree = ast.parse(source) if constants else None
    for constant in constants:
        name = constant.name
        clash = ["a builtin"] if hasattr(builtins, name) else _other_bindings(tree, name)
        if clash:
            raise SplitformerError(f"{where}: the constant {name!r} is also {clash[0]} of the emitted module, which "
                                   "would compute with the one in place of the other; rename the constant")
    return source
