"""Knowledge-distillation parts shared by methods (and, later, the elastic teacher service)."""
