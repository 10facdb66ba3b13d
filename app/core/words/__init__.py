"""Words shared across the app: the causes' table, the PNG's parameters text, and other tools' names for HalfSafe's settings."""
