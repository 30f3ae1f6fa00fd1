"""A module that ends the process when imported (a hostile or broken task module, for the
worker tests): importing it must fail only the attempt that named it."""

raise SystemExit("this module exits when imported")
