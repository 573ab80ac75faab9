// Lets a library target exist before its folder has sources (a new folder during bring-up).
