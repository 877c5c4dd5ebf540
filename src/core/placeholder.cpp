// keeps the library non-empty until the first real source lands
