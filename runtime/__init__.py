"""The runtime helpers of the generated modules as real, tested modules.

Generated code never imports them: ``codegen.runtime_source`` inlines the definitions a generated
module uses into it, so that it imports only the standard library and its backend. These modules
import nothing from splitformer but each other."""
