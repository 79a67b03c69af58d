"""Link previews: a page's title, description and image, fetched safely."""
