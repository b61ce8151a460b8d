"""An example of a user's model package for ampflow."""
