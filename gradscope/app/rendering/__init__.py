"""How a backward signal becomes what the views show and every export draws: view settings and the rendering
pipeline, per-position maps, A/B comparison pictures, summary numbers. Plain numpy; imports no other app package."""
