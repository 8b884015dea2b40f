# Writes OUT, a C file defining nf_serve_page[] / nf_serve_page_len from the bytes of IN (the chat
# page), so the server binary carries the page with no file next to it.
file(READ ${IN} hex HEX)
string(LENGTH "${hex}" n)
math(EXPR len "${n} / 2")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${hex}")
string(REGEX REPLACE "(0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,)" "\\1\n" bytes "${bytes}")
file(WRITE ${OUT} "/* generated from src/serve/chat.html by src/serve/embed.cmake */\n#include <stddef.h>\n"
     "const unsigned char nf_serve_page[] = {\n${bytes}0};\nconst size_t nf_serve_page_len = ${len};\n")
