"""HalfSafe's core: hardware, precision, models, health check, generation. No Qt here."""
