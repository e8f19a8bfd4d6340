"""avo_ops code generator: YAML operator specs -> CUDA / CPU kernels, bindings, Python glue.

Pipeline (one module per stage):
    load      YAML -> frozen model objects that remember their file:line   (model.py)
    ir        math strings -> typed expression DAG                         (expr.py, ir.py)
    autodiff  reverse-mode differentiation of the DAG -> backward math      (autodiff.py)
    schedule  kernel pattern and its size/layout-tiered variants           (schedule.py)
    emit      CUDA, CPU, registration and Python sources                   (emit_*.py)

The generator never imports torch: it runs before anything is built.
"""
