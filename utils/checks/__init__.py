"""One module of lab checks per lesson: utils.checks.lab00 ... lab06 (each lab's `# CHECK` cells call them)."""
