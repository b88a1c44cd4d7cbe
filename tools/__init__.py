"""Scripts run by hand or by make (demo, soak, outcomes demo): not tests."""
