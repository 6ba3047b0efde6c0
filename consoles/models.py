"""No models. The module exists so Django sends this app a post_migrate signal (it skips apps
without one), which sets up the role groups (consoles.roles) after every migrate."""
